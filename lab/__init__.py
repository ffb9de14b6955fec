"""This repository's lab: the experiments behind its results, the README's generated tables, benchmarks and the
Hub endpoint its tests push to. It runs from a checkout (``python -m lab COMMAND``) and is not part of the installed
package, which holds what a timm or transformers user imports; the lab imports the package, never the reverse."""

from pathlib import Path

#: the checkout the lab runs from: its results/, model_cards/ and README.md
REPOSITORY = Path(__file__).resolve().parent.parent
