"""Stored in a folder. It implements what ``huggingface_hub`` needs to push and pull models (repo create, preupload, LFS
batch upload, NDJSON commit, resolve, revision and tree listing, model info, token check), so the real push and pull
code of timm, transformers and pape_hub runs where the public Hub is out of reach. Writes need the token (printed at
start, or --token); reads of public repos do not.

Example:
    python -m lab hub serve --port 8910 --data-dir hub-data
    export HF_ENDPOINT=http://127.0.0.1:8910 HF_TOKEN=<printed token> HF_HUB_DISABLE_XET=1
    pape-hub push outputs/run/best --repo-id pape-hub/my-model
    python -c "import pape_hub, timm; timm.create_model('hf-hub:pape-hub/my-model', pretrained=True)"
"""

from __future__ import annotations

import argparse

from pape_hub_cli import HelpFormatter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    serve = sub.add_parser("serve", help="serve a local Hub endpoint until interrupted",
                           formatter_class=HelpFormatter)  # the commands' own: a stated default is not repeated
    serve.add_argument("--port", type=int, default=8910, help="TCP port on 127.0.0.1 (0: any free port)")
    serve.add_argument("--data-dir", default="hub-data", help="where repositories and files are stored")
    serve.add_argument("--token", default=None, help="the token writes need (default: a random one, printed)")
    serve.add_argument("--upload-mode", choices=["auto", "regular", "lfs"], default="auto",
                       help="auto: LFS for binary or large files, like the Hub; regular / lfs: every file")


def run(args: argparse.Namespace) -> int:
    from ..local_hub import serve

    serve(args.data_dir, args.port, token=args.token, upload_mode=args.upload_mode)
    return 0
