"""``pape-hub``: the command line. Each sub-command lives in :mod:`pape_hub.commands`."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "arrows": "the main job: train encodings on the arrow task and compare them on larger grids",
    "zoo": "build registered models and run them at two resolutions",
    "bench": "speed of every encoding against timm's own ViTs",
    "train": "train a model (accelerate) on the arrow task or an image dataset",
    "eval": "evaluate a checkpoint across sizes, with and without position interpolation",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pape-hub", description="pape_hub: vision position encodings for timm")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"pape_hub.commands.{name}")
        module.add_arguments(sub.add_parser(name, help=help_text, description=module.__doc__))
    args = parser.parse_args(argv)
    return importlib.import_module(f"pape_hub.commands.{args.command}").run(args)


if __name__ == "__main__":
    sys.exit(main())
