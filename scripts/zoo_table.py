"""Build every registered model (sizes t, s, b by default), print parameters and a forward at two resolutions.

Same as ``pape-hub zoo``; run ``python scripts/zoo_table.py --help`` for the flags.
"""

import argparse
import sys

from pape_hub.commands import zoo

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    zoo.add_arguments(parser)
    sys.exit(zoo.run(parser.parse_args()))
