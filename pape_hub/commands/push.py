"""One commit. The folder is what training writes (``OUTPUT/best``) or what ``pape_hub.save_checkpoint(model, folder)``
writes for any registered model. A push sends exactly the files pape_hub wrote there (the folder's manifest): weights
(safetensors, or the shards of a sharded save), ``config.json`` (both faces), the processor config, the remote-code
files, the results JSON, the plot, and the model card (``README.md``; a card pape_hub generated is re-rendered for the
repo id, one you wrote is left alone). Anything else in the folder stays local unless ``--include`` names it.
The repo is created if needed; pushing again makes a new commit and
deletes nothing. Token and endpoint come from the usual places (``HF_TOKEN`` / the saved login, ``HF_ENDPOINT``);
``python -m lab hub serve`` runs an endpoint on this machine.

Examples:
    pape-hub push outputs/run/best --repo-id my-org/vit-t4-pape-arrows
    HF_ENDPOINT=http://127.0.0.1:8910 HF_HUB_DISABLE_XET=1 HF_TOKEN=... pape-hub push outputs/run/best \\
        --repo-id pape-hub/vit-t4-pape-arrows
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a checkpoint folder (config.json + model.safetensors)")
    parser.add_argument("--repo-id", required=True, help="namespace/name of the Hub repository")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--message", default=None, help="commit message (default: names the model)")
    parser.add_argument("--include", action="append", default=[], metavar="PATTERN",
                        help="also upload the files matching this glob pattern, relative to the folder (repeatable; "
                        "e.g. 'plots/*.png'). Without it a push sends exactly the checkpoint's own files: those "
                        "pape_hub wrote there (its manifest), listed before the upload")


def run(args: argparse.Namespace) -> int:
    from ..hub import check_checkpoint_dir, check_push_target, push_checkpoint

    check_checkpoint_dir(args.checkpoint)  # a broken folder is named before any network call
    check_push_target(args.repo_id)
    url = push_checkpoint(args.checkpoint, args.repo_id, private=args.private, commit_message=args.message,
                          include=args.include)
    print(f"pushed {args.checkpoint} to {args.repo_id}: {url}")
    return 0
