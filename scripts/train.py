"""Train any pape_hub model; works under ``accelerate launch``.

The same as ``pape-hub train``; ``--help`` lists the flags.
"""

import sys

from pape_hub_cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
