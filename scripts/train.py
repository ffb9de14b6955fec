"""Train any pape_hub model (same as ``pape-hub train``); works under ``accelerate launch``."""

import argparse
import sys

from pape_hub.commands import train

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=train.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_arguments(parser)
    sys.exit(train.run(parser.parse_args()))
