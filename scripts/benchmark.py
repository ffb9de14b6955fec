"""Speed of every encoding against timm's own ViTs (the same as ``pape-hub bench``; ``--help`` lists the flags)."""

import sys

from pape_hub_cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
