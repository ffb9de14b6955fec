"""Evaluate a checkpoint across sizes (same as ``pape-hub eval``)."""

import argparse
import sys

from pape_hub.commands import eval as eval_command

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=eval_command.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    eval_command.add_arguments(parser)
    sys.exit(eval_command.run(parser.parse_args()))
