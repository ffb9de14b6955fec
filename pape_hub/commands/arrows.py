"""``pape-hub arrows``: the main job. Train several encodings on the built-in arrow task, evaluate each on
larger grids than it saw (with and without position interpolation, and with shuffled patches), and write a
comparison table and plot.

Default: ape, rope_mixed, pape, liere8 on the easy setting (grid 4, cell 12 px = patch, 4 balanced arrows, no
letters, no hard negatives), a ViT of width 96, depth 4, 4 heads with average pooling, 8 epochs of 16,384 images,
two training processes with one thread each; evaluation on grids 4, 6 and 8. ``--full`` trains every encoding
for twice as long; ``--paper`` uses the LieRE paper's harder setting (expect many more images to leave chance).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ..card import write_model_card
from ..encodings import list_encodings
from ..evaluation import evaluate_checkpoint, plot_sweeps, write_json

DEFAULT_ENCODINGS = ["ape", "rope_mixed", "pape", "liere8"]
ARROW_MODEL = dict(embed_dim=96, depth=4, num_heads=4, global_pool="avg", class_token=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--encodings", default=",".join(DEFAULT_ENCODINGS), help="comma-separated, or 'all'")
    parser.add_argument("--full", action="store_true", help="every encoding, twice the schedule")
    parser.add_argument("--paper", action="store_true", help="LieRE's setting: grid 9, 8 arrows, letters, hard negs")
    parser.add_argument("--epochs", type=int, default=None, help="default 8 (16 with --full)")
    parser.add_argument("--train-size", type=int, default=16384, help="images per epoch")
    parser.add_argument("--eval-size", type=int, default=2000)
    parser.add_argument("--eval-grids", default=None, help="default: train grid, +2, +4")
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds")
    parser.add_argument("--jobs", type=int, default=2, help="training processes at once (one thread each)")
    parser.add_argument("--output-dir", default="outputs/arrows")


def arrow_setting(args: argparse.Namespace) -> dict[str, int]:
    if args.paper:
        return dict(grid=9, cell=12, num_arrows=8, num_letters=5, hard_negatives=1)
    return dict(grid=4, cell=12, num_arrows=4, num_letters=0, hard_negatives=0)


def train_command(enc: str, seed: int, setting: dict[str, int], epochs: int, args: argparse.Namespace,
                  out: Path) -> list[str]:
    kwargs = dict(ARROW_MODEL, patch_size=setting["cell"])
    return [
        sys.executable, "-m", "pape_hub.cli", "train", "--model", f"vit_t4_{enc}", "--model-kwargs", json.dumps(kwargs),
        "--dataset", "arrows", "--epochs", str(epochs), "--batch-size", "128", "--lr", "2e-3",
        "--warmup-epochs", "1", "--label-smoothing", "0", "--drop-path", "0", "--weight-decay", "0.05",
        "--train-size", str(args.train_size), "--eval-size", str(args.eval_size), "--seed", str(seed),
        "--arrow-grid", str(setting["grid"]), "--arrow-cell", str(setting["cell"]),
        "--arrow-arrows", str(setting["num_arrows"]), "--arrow-letters", str(setting["num_letters"]),
        "--arrow-hard-negatives", str(setting["hard_negatives"]), "--threads", "1", "--quiet",
        "--output-dir", str(out),
    ]


def run(args: argparse.Namespace) -> int:
    started = time.time()
    encodings = list_encodings() if args.full or args.encodings == "all" else args.encodings.split(",")
    epochs = args.epochs or (16 if args.full else 8)
    seeds = [int(s) for s in args.seeds.split(",")]
    setting = arrow_setting(args)
    grids = [int(g) for g in args.eval_grids.split(",")] if args.eval_grids else \
        [setting["grid"], setting["grid"] + 2, setting["grid"] + 4]
    root = Path(args.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    runs = [(enc, seed, root / f"{enc}_seed{seed}") for enc in encodings for seed in seeds]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    print(f"training {len(runs)} model(s) on the arrow task {setting}, {epochs} epochs x {args.train_size} images, "
          f"{args.jobs} at a time", flush=True)

    pending, active, failed = list(runs), [], []
    while pending or active:
        while pending and len(active) < args.jobs:
            enc, seed, out = pending.pop(0)
            log = open(root / f"{out.name}.log", "w")  # noqa: SIM115 - closed when the process ends
            cmd = train_command(enc, seed, setting, epochs, args, out)
            active.append((enc, seed, out, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
        time.sleep(1)
        for item in list(active):
            enc, seed, out, proc, log = item
            if proc.poll() is not None:
                log.close()
                active.remove(item)
                status = "done" if proc.returncode == 0 else f"FAILED (see {root / (out.name + '.log')})"
                if proc.returncode:
                    failed.append(enc)
                print(f"  {enc} seed {seed}: {status} after {time.time() - started:.0f}s", flush=True)

    results = []
    for enc, seed, out in runs:
        if not (out / "best").exists():
            continue
        res = evaluate_checkpoint(out / "best", "arrows", sizes=grids, eval_size=args.eval_size)
        res["label"] = f"{enc}" if len(seeds) == 1 else f"{enc} s{seed}"
        res["seed"] = seed
        res["train"] = json.loads((out / "results.json").read_text())
        results.append(res)
        write_json(res, out / "eval.json")
        plot_sweeps([res], out / "best" / "accuracy_vs_grid.png", title=f"{enc}, trained on grid {setting['grid']}")
        write_model_card(out / "best", res, plot="accuracy_vs_grid.png")

    table = summary_table(results, grids)
    summary = dict(setting=setting, epochs=epochs, train_size=args.train_size, grids=grids, seeds=seeds,
                   wall_s=round(time.time() - started), results=results)
    write_json(summary, root / "summary.json")
    (root / "summary.md").write_text(table + "\n")
    plot_sweeps(results, root / "accuracy_vs_grid.png", title=f"arrow task, trained on grid {setting['grid']}")
    print("\n" + table)
    print(f"\nwall time {time.time() - started:.0f}s; outputs: {root}/summary.md, {root}/summary.json, "
          f"{root}/accuracy_vs_grid.png, checkpoints (with model cards) in {root}/<encoding>_seed<k>/best")
    return 1 if failed else 0


def summary_table(results: list[dict], grids: list[int]) -> str:
    head = ["encoding", "best val"] + [f"grid {g}" for g in grids] + [f"grid {g} interp." for g in grids[1:]] + \
        [f"grid {grids[0]} shuffled"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        def acc(size: int, interp: bool = False, shuffle: bool = False, rows: list = res["rows"]) -> str:
            hits = [r["top1"] for r in rows if r["size"] == size and r["interpolation"] == interp
                    and bool(r.get("patch_shuffle")) == shuffle]
            return f"{hits[0]:.3f}" if hits else "-"

        cells = [res["label"], f"{res['train']['best_val_top1']:.3f}"] + [acc(g) for g in grids] + \
            [acc(g, True) for g in grids[1:]] + [acc(grids[0], shuffle=True)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
