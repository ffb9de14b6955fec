"""Scores a checkpoint across arrow-grid sizes, image resolutions or video clips, with and without position
interpolation, plus the patch-shuffle test; writes ``eval.json`` and its plot into the checkpoint folder, where
``pape-hub card`` and ``pape-hub push`` take them from (``--output`` writes them elsewhere).

Examples:
    pape-hub eval outputs/main/pape/best --dataset arrows --sizes 4,6,8 --output results.json
    pape-hub eval runs/vit_b16_pape/best --dataset imagefolder:/data/imagenet --resolutions 224,320,384,448
    pape-hub eval outputs/motion_rope/best --dataset motion --clips 6x5,6x7,10x5
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..checkpoint import check_output_path
from ..cpu import flush_denormals
from ..data import DATASET_SPECS
from ..evaluation import evaluate_checkpoint, resolve_eval_target, save_evaluation


def ints(text: str | None) -> list[int] | None:
    return [int(t) for t in text.split(",")] if text else None


def grids(text: str | None) -> list[int | str] | None:
    """Arrow grids: a number of cells per side, or ROWSxCOLUMNS for a grid that is not square."""
    return [int(t) if t.strip().isdigit() else t.strip() for t in text.split(",")] if text else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a checkpoint folder (config.json + model.safetensors), or a training "
                        "output folder (its best/ is evaluated)")
    parser.add_argument("--dataset", default=None, help=f"{DATASET_SPECS} (default: the built-in task or digits the "
                        "checkpoint was trained on; other datasets must be named)")
    parser.add_argument("--sizes", default=None, help="arrow task: comma-separated grid sizes, ROWSxCOLUMNS for other "
                        "aspect ratios, e.g. 4,6,4x8,8x4 (default: the training grid g and g + 2, g + 4, as the main "
                        "job compares them)")
    parser.add_argument("--resolutions", default=None, help="images: comma-separated sizes (default: 1x, 1.5x and 2x "
                        "the training size)")
    parser.add_argument("--clips", default=None, help="video: comma-separated FRAMESxSIZE, e.g. 6x5,6x7,10x5 "
                        "(motion task: size in cells; default: the training clip, 2 more cells, 2 more time steps) or "
                        "16x224,32x224 (video folders: pixels; default: the training clip)")
    parser.add_argument("--interpolation", choices=["both", "on", "off"], default="both")
    parser.add_argument("--split", choices=["test", "validation", "val"], default=None,
                        help="the split to score (default: test; a dataset without one scores its validation split, "
                        "and says so); --split test without a test split is refused")
    parser.add_argument("--eval-size", type=int, default=2000, help="arrow task: samples per grid size")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--patch-shuffle", choices=["trained", "all", "none"], default="trained",
                        help="score shuffled patches at the training size, at every size, or not at all")
    parser.add_argument("--output", default=None, help="results JSON; its plot goes beside it as .png (default: "
                        "CHECKPOINT/eval.json and CHECKPOINT/accuracy_vs_size.png, which its model card shows)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def run(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.output:  # before the evaluation: never over a checkpoint's own files
        check_output_path(args.output)
        check_output_path(Path(args.output).with_suffix(".png"), "--output's plot")
    checkpoint, dataset = resolve_eval_target(args.checkpoint, args.dataset)
    with flush_denormals():  # subnormal floats are slow on CPU and change no prediction
        result = evaluate_checkpoint(checkpoint, dataset, sizes=grids(args.sizes),
                                     resolutions=ints(args.resolutions), interpolation=args.interpolation,
                                     split=args.split, batch_size=args.batch_size, eval_size=args.eval_size,
                                     patch_shuffle={"trained": True, "all": "all", "none": False}[args.patch_shuffle],
                                     clips=args.clips.split(",") if args.clips else None)
    output, plot = save_evaluation(result, checkpoint, args.output)
    top5 = (result.num_classes or 6) > 5  # with 5 classes or fewer, top-5 is 1 whatever the model does
    wide = max([6, *(len(str(row.size)) for row in result.rows)])  # point and event sweeps name their passes
    print(f"{'size':>{wide}} {'interp':>6} {'shuffle':>7} {'top-1':>7}" + (f" {'top-5':>7}" if top5 else ""))
    for row in result.rows:
        print(f"{row.size!s:>{wide}} {str(row.interpolation):>6} {str(row.patch_shuffle):>7} {row.top1:>7.4f}"
              + (f" {row.top5:>7.4f}" if top5 else ""))
    if (chance := result.at_chance()) is not None:
        row, (low, high) = chance
        print(f"note: top-1 {row.top1:.4f} at the training size lies within chance's 95% interval ({low:.4f} to "
              f"{high:.4f} for {result.num_classes} classes, {row.count} samples): the model learned nothing usable")
    print(f"wrote {output} and {plot}")
    return 0
