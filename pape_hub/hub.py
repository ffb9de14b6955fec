"""Pushing checkpoints to a Hugging Face Hub, all through ``huggingface_hub``.

* :func:`check_push_target` - repo id, token and endpoint, checked before any training starts;
* :func:`push_checkpoint` - one checkpoint folder (weights, config, processor config, remote-code files, results,
  plots and the model card) uploaded in a single commit; re-pushing makes a new commit and deletes nothing.

The endpoint is ``huggingface_hub``'s (``HF_ENDPOINT``, default the public Hub); the token comes from the usual
places (``HF_TOKEN``, the saved login). This repository's Hub endpoint on 127.0.0.1, which its tests and the main
job push to where the public Hub is out of reach, is lab tooling (``lab/local_hub.py``), not part of the package.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

__all__ = ["CHECKPOINT_FILES", "check_checkpoint_dir", "check_push_target", "push_checkpoint"]

_logger = logging.getLogger(__name__)

#: what a pushed checkpoint repo holds (everything else in the folder stays local)
CHECKPOINT_FILES = ["model.safetensors", "config.json", "preprocessor_config.json", "video_preprocessor_config.json",
                    "*.py", "README.md", "*.png", "eval.json", "results.json"]


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
    linked = sorted(p.name for pattern in CHECKPOINT_FILES for p in directory.glob(pattern) if p.is_symlink())
    if linked:
        raise ValueError(f"{directory} holds links ({', '.join(linked)}); a push uploads the folder's own files "
                         "only, so replace each link with the file it points to")
    try:
        with safe_open(str(weights), "pt") as fh:
            fh.keys()
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{weights} is corrupt or not a safetensors file: {err}") from err
    return config


def push_checkpoint(directory: str | Path, repo_id: str, private: bool = False, commit_message: str | None = None
                    ) -> str:
    """Upload a checkpoint folder to ``repo_id`` in one commit; returns the commit URL.

    The repo is created if needed. A model card this package generated (or none) is (re)written for ``repo_id``
    first, from the folder's config and results, so its loading snippet names the real repo. Only the folder's own
    regular files go (a link out of the folder is refused by name).

    Args:
        directory: a checkpoint folder (:func:`~pape_hub.checkpoint.save_checkpoint`, training's ``best/``).
        repo_id: ``namespace/name`` on the Hub ``HF_ENDPOINT`` names (default the public Hub); ``HF_TOKEN`` or the
            saved login must have write access.
        private: create the repo private, or make an existing public one private first (logged).
        commit_message: the commit's title (default: names the model).

    Example:
        >>> import pape_hub, timm
        >>> url = pape_hub.push_checkpoint("my_model", "my-org/vit-t4-pape")  # the folder save_checkpoint wrote
        >>> model = timm.create_model("hf-hub:my-org/vit-t4-pape", pretrained=True)
    """
    from huggingface_hub import HfApi

    from .card import GENERATED_MARK, card_from_folder

    directory = Path(directory)
    config = check_checkpoint_dir(directory)
    check_push_target(repo_id)
    card = directory / "README.md"
    if not card.exists() or GENERATED_MARK in card.read_text():  # a card the user wrote is left as it is
        card_from_folder(directory, repo_id=repo_id)
    api = HfApi(token=hub_token())
    api.create_repo(repo_id, private=private, exist_ok=True)
    if private and not api.repo_info(repo_id).private:  # create_repo leaves an existing repo's visibility as it is
        api.update_repo_settings(repo_id, private=True)
        _logger.warning("%s existed as a public repository; made it private before uploading, as asked", repo_id)
    info = api.upload_folder(
        repo_id=repo_id, folder_path=str(directory), allow_patterns=CHECKPOINT_FILES,
        commit_message=commit_message or f"Upload {config['architecture']} ({config['position_encoding']})")
    return str(info.commit_url or info.repo_url)
