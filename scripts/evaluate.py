"""Evaluate a checkpoint across sizes (the same as ``pape-hub eval``; ``--help`` lists the flags)."""

import sys

from pape_hub_cli import main

if __name__ == "__main__":
    sys.exit(main(["eval", *sys.argv[1:]]))
