"""Build every registered model and run a forward at two resolutions.

The same as ``pape-hub zoo``; ``--help`` lists the flags.
"""

import sys

from pape_hub_cli import main

if __name__ == "__main__":
    sys.exit(main(["zoo", *sys.argv[1:]]))
