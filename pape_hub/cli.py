"""``python -m pape_hub.cli``: the same command line as ``pape-hub`` (which lives in :mod:`pape_hub_cli`, outside
this package, so that ``pape-hub --help`` does not import torch)."""

import sys

from pape_hub_cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
