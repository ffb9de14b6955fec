"""``python -m lab COMMAND``: this repository's experiments, README tables, benchmarks and local Hub, run from a
checkout (``python -m lab --help`` lists them; ``make main`` runs ``arrows`` then ``report``)."""

from __future__ import annotations

import sys

from pape_hub_cli import CommandLine

LAB = CommandLine(
    prog="python -m lab", description="pape_hub's lab: the experiments, README tables, benchmarks and the local Hub "
    "endpoint of this repository (not part of the installed package).",
    commands={
        "arrows": "the main job: train encodings on the arrow task and compare them on larger grids",
        "compare": "train several encodings on one dataset and compare them across resolutions (e.g. digits)",
        "modalities": "every free-coordinate encoding on generated point clouds and event streams, over seeds",
        "report": "regenerate the README's results tables from results/ (or --check that they are current)",
        "bench": "speed of every encoding against timm's own ViTs",
        "profile": "per-layer kernels, bytes and calls per forward of each encoding's positional work",
        "padding": "time of native-resolution batches (per-token positions, padding) against square batches",
        "memory": "peak memory and time against tokens (224 -> 1024 px), every encoding, each in a fresh process",
        "zoo": "build registered models and run them at two resolutions",
        "hub": "a Hugging Face Hub endpoint on 127.0.0.1 (`hub serve`) for offline push and pull",
    },
    package="lab.commands", long=("arrows", "compare", "modalities", "bench", "profile", "memory", "padding", "zoo"))

if __name__ == "__main__":
    sys.exit(LAB.main())
