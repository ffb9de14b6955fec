"""Speed of every encoding against timm's own ViTs (same as ``pape-hub bench``; ``--help`` for flags)."""

import argparse
import sys

from pape_hub.commands import bench

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=bench.__doc__)
    bench.add_arguments(parser)
    sys.exit(bench.run(parser.parse_args()))
