"""Pushing checkpoints to a Hugging Face Hub, all through ``huggingface_hub``.

* :func:`check_push_target` - repo id, token and endpoint, checked before any training starts;
* :func:`push_checkpoint` - one checkpoint folder uploaded in a single commit: exactly the files pape_hub wrote
  there (the folder's manifest: weights, config, processor config, remote-code files, results, plot and card),
  plus what ``include`` names; re-pushing makes a new commit and deletes nothing.

The endpoint is ``huggingface_hub``'s (``HF_ENDPOINT``, default the public Hub); the token comes from the usual
places (``HF_TOKEN``, the saved login). This repository's Hub endpoint on 127.0.0.1, which its tests and the main
job push to where the public Hub is out of reach, is lab tooling (``lab/local_hub.py``), not part of the package.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

__all__ = ["check_checkpoint_dir", "check_push_target", "files_to_push", "push_checkpoint"]

_logger = logging.getLogger(__name__)

def check_repo_id(repo_id: str) -> str:
    """``namespace/name`` with the Hub's rules (letters, digits, ``-_.``, at most 96 characters per part)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        raise ValueError(f"repo id {repo_id!r} is malformed: expected 'namespace/name', e.g. 'my-org/vit-b16-pape'")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(f"repo id {repo_id!r} is malformed: {err}") from err
    return repo_id


def hub_token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


def check_push_target(repo_id: str) -> str:
    """Fail fast (before training) on a malformed repo id, a missing or rejected token, or an unreachable
    endpoint. Returns the repo id."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError

    check_repo_id(repo_id)
    token = hub_token()
    if token is None:
        raise PermissionError(f"pushing to {repo_id} needs a Hugging Face token with write access: set HF_TOKEN or "
                              f"run `hf auth login` (endpoint {constants.ENDPOINT})")
    if constants.HF_HUB_OFFLINE:  # no request can succeed: say so at once instead of retrying
        raise ConnectionError(f"pushing to {repo_id} needs the Hub, but HF_HUB_OFFLINE is set; unset it")
    print(f"checking the token with {constants.ENDPOINT} ...", file=sys.stderr, flush=True)
    try:
        HfApi(token=token).whoami()
    except HfHubHTTPError as err:
        status = getattr(err.response, "status_code", None)
        raise PermissionError(f"the Hub at {constants.ENDPOINT} refused the token (HTTP {status}); check HF_TOKEN"
                              ) from err
    except Exception as err:  # noqa: BLE001 - the HTTP client's connection errors are not OSErrors
        raise ConnectionError(f"cannot reach the Hub at {constants.ENDPOINT} ({type(err).__name__}: {err}); check "
                              "the network or HF_ENDPOINT") from err
    return repo_id


def check_checkpoint_dir(directory: str | Path) -> dict[str, Any]:
    """A folder :func:`pape_hub.save_checkpoint` (or training) wrote: its config, after checking it is whole."""
    from safetensors import SafetensorError, safe_open

    from .checkpoint import read_config

    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint folder {directory} does not exist")
    config = read_config(directory)  # names a missing or corrupt config.json
    if "position_encoding" not in config or "architecture" not in config:
        raise ValueError(f"{directory / 'config.json'} is not a pape_hub checkpoint config (no position_encoding / "
                         "architecture); write the folder with pape_hub.save_checkpoint")
    weights = directory / "model.safetensors"
    if not weights.exists():
        raise FileNotFoundError(f"{directory} has no model.safetensors")
    try:
        with safe_open(str(weights), "pt") as fh:
            fh.keys()
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{weights} is corrupt or not a safetensors file: {err}") from err
    return config


def files_to_push(directory: str | Path, include: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The files a push of ``directory`` sends, as paths relative to it: the checkpoint's own files (those its
    manifest lists, checked to be plain names of regular files; a folder saved before manifests: the names a save
    writes) and the files matching ``include`` (glob patterns relative to the folder, e.g. ``plots/*.png``). Nothing
    else in the folder goes: not the user's scripts, data or hidden files. A link, or a match outside the folder,
    is refused by name."""
    from .checkpoint import owned_files
    from .folder import MANIFEST

    directory = Path(directory)
    root = directory.resolve()
    chosen = set(owned_files(directory)) - {MANIFEST}  # the manifest is this machine's bookkeeping
    for pattern in include:
        matches = sorted(directory.glob(pattern))
        if not matches:
            raise FileNotFoundError(f"--include {pattern!r} matches no file in {directory}")
        for path in matches:
            if path.is_dir() and not path.is_symlink():
                continue  # a pattern such as plots/** also matches folders; their files match on their own
            inside = path.resolve().is_relative_to(root) and not path.relative_to(directory).as_posix().startswith("..")
            if path.is_symlink() or not path.is_file() or not inside:
                raise ValueError(f"--include {pattern!r} matches {path}, which is a link or lies outside {directory}; "
                                 "a push uploads the folder's own regular files only: copy the file in instead")
            chosen.add(path.relative_to(directory).as_posix())
    for name in sorted(chosen):
        if (directory / name).is_symlink():
            raise ValueError(f"{directory / name} is a link; a push uploads the folder's own files only, so replace "
                             "the link with the file it points to")
    return sorted(chosen)


def push_checkpoint(directory: str | Path, repo_id: str, private: bool = False, commit_message: str | None = None,
                    include: list[str] | tuple[str, ...] = (), quiet: bool = False) -> str:
    """Upload a checkpoint folder to ``repo_id`` in one commit; returns the commit URL.

    The repo is created if needed. A model card this package generated (or none) is (re)written for ``repo_id``
    first, from the folder's config and results, so its loading snippet names the real repo. What goes is
    :func:`files_to_push`: the files pape_hub wrote in the folder (its manifest) and what ``include`` names, each
    listed on stderr before the upload (``quiet`` leaves the list out).

    Args:
        directory: a checkpoint folder (:func:`~pape_hub.checkpoint.save_checkpoint`, training's ``best/``).
        repo_id: ``namespace/name`` on the Hub ``HF_ENDPOINT`` names (default the public Hub); ``HF_TOKEN`` or the
            saved login must have write access.
        private: create the repo private, or make an existing public one private first (logged).
        commit_message: the commit's title (default: names the model).
        include: glob patterns (relative to the folder) of further files to upload, e.g. ``["plots/*.png"]``.

    Example:
        >>> import pape_hub, timm
        >>> url = pape_hub.push_checkpoint("my_model", "my-org/vit-t4-pape")  # the folder save_checkpoint wrote
        >>> model = timm.create_model("hf-hub:my-org/vit-t4-pape", pretrained=True)
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    from .card import GENERATED_MARK, card_from_folder

    directory = Path(directory)
    config = check_checkpoint_dir(directory)
    files_to_push(directory, include)  # a bad --include is named before any network call
    check_push_target(repo_id)
    card = directory / "README.md"
    if not card.exists() or GENERATED_MARK in card.read_text():  # a card the user wrote is left as it is
        card_from_folder(directory, repo_id=repo_id)
    files = files_to_push(directory, include)  # again: the card may be new
    if not quiet:
        print(f"pushing {len(files)} files of {directory} to {repo_id}: {', '.join(files)}", file=sys.stderr,
              flush=True)
    api = HfApi(token=hub_token())
    api.create_repo(repo_id, private=private, exist_ok=True)
    if private and not api.repo_info(repo_id).private:  # create_repo leaves an existing repo's visibility as it is
        api.update_repo_settings(repo_id, private=True)
        _logger.warning("%s existed as a public repository; made it private before uploading, as asked", repo_id)
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(directory / name)) for name in files]
    info = api.create_commit(
        repo_id=repo_id, operations=operations,
        commit_message=commit_message or f"Upload {config['architecture']} ({config['position_encoding']})")
    return str(info.commit_url)
