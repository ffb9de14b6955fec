"""The card (``README.md`` in the folder) is rendered with ``huggingface_hub.ModelCard`` from the folder's
``config.json`` and ``eval.json`` (from ``pape-hub eval CHECKPOINT --output CHECKPOINT/eval.json`` or the main job),
optionally a benchmark JSON for the speed section; it claims no number those files do not hold.

Example:
    pape-hub eval outputs/run/best --sizes 4,6,8 --output outputs/run/best/eval.json
    pape-hub card outputs/run/best --repo-id my-org/vit-t4-pape-arrows --bench results/bench_vit_b16_224_cpu.json
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a checkpoint folder (config.json, optionally eval.json)")
    parser.add_argument("--repo-id", default=None, help="the repo the card's loading snippets name")
    parser.add_argument("--bench", default=None, help="a `python -m lab bench` JSON for the speed section")
    parser.add_argument("--output", default=None, help="write the card here (default CHECKPOINT/README.md)")
    parser.add_argument("--overwrite", action="store_true", help="replace a README.md that pape_hub did not "
                        "generate (a card you wrote is otherwise left as it is, and the command stops)")


def run(args: argparse.Namespace) -> int:
    from ..card import card_from_folder, check_card_target, read_bench
    from ..checkpoint import check_output_path, read_config, record_outputs
    from ..hub import check_checkpoint_dir
    from ..records import COMPARISON_FILE, EVALUATION_FILE, ComparisonContext, read_evaluation

    folder = Path(args.checkpoint)
    check_checkpoint_dir(folder)
    # before anything is written: never over the checkpoint's own files, nor over a README the user wrote
    check_card_target(check_output_path(args.output) if args.output else folder / "README.md", args.overwrite)
    if args.bench:  # the speed goes beside the evaluation, into the comparison context; eval.json stays as measured
        evaluation, comparison = read_evaluation(folder)
        if evaluation is None:
            raise FileNotFoundError(f"{folder / EVALUATION_FILE} is missing: run `pape-hub eval {folder}` first")
        comparison = comparison or ComparisonContext(seeds=[])
        bench = read_bench(Path(args.bench), str(read_config(folder)["position_encoding"]))  # whole, before writing
        comparison.bench = bench
        comparison.write(folder)
        record_outputs(folder, COMPARISON_FILE)
    path = card_from_folder(folder, repo_id=args.repo_id, path=args.output, overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0
