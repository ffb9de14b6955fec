r"""Trains encodings on the built-in arrow task (LieRE section 5.2), evaluates each on larger grids than it saw (with
and without position interpolation, and with shuffled patches), and write a table over seeds (mean +- std), a plot, and
a checkpoint with a model card per encoding, pushed to a Hub and loaded back from it by repo id.

Default: ape, rope_mixed, pape, pape_ri, liere8, alibi, seeds 0 to 4, on the easy setting (grid 4, cell 12 px =
patch, 4 balanced arrows, no letters, no hard negatives), a ViT of width 96, depth 4, 4 heads with average pooling,
5 epochs of 12,288 images, two single-thread worker processes; evaluation on grids 4, 6 and 8 (2,000 test images
each). About 25 minutes on 2 CPU cores; a progress bar counts the epochs of all runs.

Examples:
    python -m lab arrows                                   # the main job (README table, results/arrows_main_job)
    python -m lab arrows --full                            # every encoding, twice the schedule (results/arrows_full)
    python -m lab arrows --encodings rope,rope_mixed --seeds 0 --results-dir none
    python -m lab arrows --paper --epochs 40               # the LieRE paper's harder setting
    python -m lab arrows --encodings pape --epochs 1 --init-from outputs/src/ape_seed{seed}/best  # transplant
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from pape_hub.records import Comparison, Evaluation

from ..experiment import make_job

DEFAULT_ENCODINGS = ["ape", "rope_mixed", "pape", "pape_ri", "liere8", "alibi"]
ARROW_MODEL = dict(embed_dim=96, depth=4, num_heads=4, global_pool="avg", class_token=False)  # vit_m12_*'s
SETTINGS = {
    "default": dict(grid=4, cell=12, num_arrows=4, num_letters=0, hard_negatives=0),
    "paper": dict(grid=9, cell=12, num_arrows=8, num_letters=5, hard_negatives=1),
    # control: no distractor arrow next to the Y, so finding the answer needs distance but not direction
    "isolated": dict(grid=4, cell=12, num_arrows=4, num_letters=0, hard_negatives=0, isolated=True),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--encodings", default=",".join(DEFAULT_ENCODINGS),
                        help="comma-separated, or 'all'; arguments in brackets, e.g. alibi[slope_scale=8]")
    parser.add_argument("--full", action="store_true", help="every encoding, twice the schedule")
    parser.add_argument("--paper", action="store_true", help="LieRE's setting: grid 9, 8 arrows, letters, hard negs")
    parser.add_argument("--isolated", action="store_true",
                        help="control setting: no distractor arrow next to the Y (direction is not needed)")
    parser.add_argument("--epochs", type=int, default=None, help="default 5 (10 with --full)")
    parser.add_argument("--train-size", type=int, default=12288, help="generated training images per epoch")
    parser.add_argument("--eval-size", type=int, default=2000, help="test images per evaluation grid")
    parser.add_argument("--eval-grids", default=None, help="comma-separated grids (default: train grid, +2, +4)")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated training seeds")
    parser.add_argument("--recipe", default="default", help="training recipe (pape_hub.recipes: init, weight-decay "
                        "groups, schedule; the task keeps its lr, epochs, batch, warm-up, weight decay, no smoothing "
                        "or drop path), e.g. paper-pape")
    parser.add_argument("--init-from", default=None, metavar="CHECKPOINT",
                        help="seed every model from this checkpoint folder ({seed} is replaced by the run's seed): the "
                        "backbone, and the encoding's own position weights (see pape_hub.transplant)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes at once (one thread each)")
    parser.add_argument("--output-dir", default="outputs/arrows", help="checkpoints and logs (replaced each run)")
    parser.add_argument("--results-dir", default=None,
                        help="where the table, JSON and plot go (default results/arrows_main_job, "
                        "results/arrows_full with --full, results/arrows_paper with --paper, each + _RECIPE for "
                        "another --recipe; 'none' to skip)")
    parser.add_argument("--hub", choices=["auto", "local", "real", "none"], default="auto",
                        help="where the seed-0 checkpoints are pushed and loaded back from: 'auto' = the Hub your "
                        "token points at if one is configured, else a Hub endpoint started on 127.0.0.1")
    parser.add_argument("--hub-namespace", default="pape-hub", help="user or organisation of the pushed repos")
    parser.add_argument("--resume", action="store_true", help="keep the runs a stopped run of this command completed "
                        "with the same settings (their folders under --output-dir) and train only the others")


def run_setting(args: argparse.Namespace) -> tuple[str, dict[str, int], int, Path | None]:
    if args.paper and args.isolated:
        raise ValueError("--paper and --isolated are different settings; choose one")
    name = "paper" if args.paper else "isolated" if args.isolated else "default"
    epochs = args.epochs or (10 if args.full else 5)
    default_dir = "results/arrows_" + ("full" if args.full else "main_job" if name == "default" else name)
    if args.recipe != "default":
        default_dir += "_" + args.recipe.replace("-", "_")
    results = args.results_dir or default_dir
    return name, SETTINGS[name], epochs, None if results == "none" else Path(results)


def model_name(encoding: str) -> str:
    """The timm entry point of the arrow task's model: ``vit_m12_*`` is ARROW_MODEL with 12-px patches."""
    return f"vit_m12_{encoding}"


def arrow_job(label: str, encoding: str, kwargs: dict[str, Any], seed: int, setting: dict[str, int], epochs: int,
              args: argparse.Namespace, root: Path, grids: list[int]) -> dict[str, Any]:
    patch = {} if setting["cell"] == 12 else {"patch_size": setting["cell"]}  # a patch is a cell
    train = dict(model=model_name(encoding), model_kwargs=patch,
                 dataset="arrows", epochs=epochs, batch_size=128, lr=2e-3, warmup_epochs=1, label_smoothing=0.0,
                 drop_path=0.0, weight_decay=0.05, recipe=args.recipe, train_size=args.train_size,
                 eval_size=args.eval_size, arrow=setting, quiet=False, overwrite=True,
                 init_from=args.init_from.format(seed=seed) if args.init_from else None)
    return make_job(label, kwargs, seed, root, train, sweep=dict(dataset="arrows", sizes=grids,
                                                                  eval_size=args.eval_size))


def run(args: argparse.Namespace) -> int:
    from pape_hub.encodings import list_encodings
    from pape_hub.recipes import get_recipe

    from ..experiment import parse_encodings, run_comparison
    from ..provenance import provenance

    get_recipe(args.recipe)  # an unknown recipe fails here, before any worker starts
    setting_name, setting, epochs, results_dir = run_setting(args)
    specs = parse_encodings("all" if args.full else args.encodings, list_encodings())
    seeds = [int(s) for s in args.seeds.split(",")]
    grids = [int(g) for g in args.eval_grids.split(",")] if args.eval_grids else \
        [setting["grid"], setting["grid"] + 2, setting["grid"] + 4]
    root = Path(args.output_dir)
    jobs = [dict(arrow_job(label, enc, kwargs, seed, setting, epochs, args, root, grids), reuse_complete=args.resume)
            for label, enc, kwargs in specs for seed in seeds]
    hub = None
    if args.hub != "none":
        from ..publish import HubTarget

        hub = HubTarget.resolve(args.hub, args.hub_namespace)  # token / endpoint problems surface before training
    print(f"training {len(jobs)} model(s) on the arrow task ({setting_name} setting: {setting}), {epochs} epochs x "
          f"{args.train_size} images, {args.jobs} at a time; each run logs a line per epoch to {root}/RUN.log",
          flush=True)

    def describe(result: Evaluation) -> str:
        return f"best val {result.train['best_val_top1']:.3f}, test grid {grids[0]} {result.accuracy(grids[0]):.3f}"

    recipe = {k: v for k, v in jobs[0]["train"].items() if k not in ("output_dir", "seed", "model", "model_kwargs")}
    # the behaviour probes (a minute) only where a results file will record them
    facts = dict(provenance=provenance("arrows", getattr(args, "command_line", None)) if results_dir else None,
                 task=dict(setting=setting_name, **setting), model=dict(ARROW_MODEL, patch_size=setting["cell"]),
                 recipe={**recipe, "init_from": args.init_from}, epochs=epochs, train_size=args.train_size,
                 eval_size=args.eval_size)
    cards_dir = Path("model_cards") if results_dir == Path("results/arrows_main_job") else None
    summary = run_comparison(jobs, args.jobs, describe, facts, grids, "grid", results_dir,
                             title=f"arrow task ({setting_name}), trained on grid {grids[0]}, mean and range over "
                             f"seeds {seeds}",
                             publish=None if hub is None else lambda summary: publish(summary, hub, cards_dir))
    print(f"wall time {summary.wall_s}s; checkpoints (with model cards) in {root}/<encoding>_seed<k>/best")
    return 1 if summary.failed else 0


def publish(summary: Comparison, hub: Any, cards_dir: Path | None) -> dict[str, Any]:
    """Give each encoding's first-seed checkpoint its evaluation, plot and model card, push them, and load each back
    by repo id from both faces (bit-identical logits to the local folder, checked in a fresh process). The cards
    are also written to ``cards_dir`` (the repository's ``model_cards/``)."""
    from pape_hub.card import PLOT_NAME, card_from_folder
    from pape_hub.checkpoint import record_outputs
    from pape_hub.evaluation import plot_sweep_summary, write_json
    from pape_hub.records import COMPARISON_FILE, EVALUATION_FILE, ComparisonContext

    first_seed = summary.seeds[0]
    bench_file = Path("results") / "bench_vit_b16_224_cpu.json"  # the encodings' speed at ViT-B, if measured
    bench = json.loads(bench_file.read_text()) if bench_file.exists() else None
    items = []
    for result in summary.runs:
        if result.seed != first_seed:
            continue
        enc = result.encoding
        checkpoint = Path(result.checkpoint)
        name = "vit-arrows-" + re.sub(r"[^A-Za-z0-9.]+", "-", enc).strip("-")
        plot_sweep_summary([result], checkpoint / PLOT_NAME, title=f"{enc}, trained on grid {summary.sizes[0]}")
        write_json(result.to_dict(), checkpoint / EVALUATION_FILE)  # this run's evaluation, as the comparison has it
        ComparisonContext(summary.seeds, summary.aggregate.get(enc), bench).write(checkpoint)
        record_outputs(checkpoint, PLOT_NAME, EVALUATION_FILE, COMPARISON_FILE)
        card_from_folder(checkpoint, repo_id=f"{hub.namespace}/{name}")
        if cards_dir is not None:
            cards_dir.mkdir(parents=True, exist_ok=True)
            (cards_dir / f"{name}.png").write_bytes((checkpoint / PLOT_NAME).read_bytes())
            card_from_folder(checkpoint, repo_id=f"{hub.namespace}/{name}", path=cards_dir / f"{name}.md",
                             plot=f"{name}.png")
        items.append((checkpoint, f"{hub.namespace}/{name}"))
    with hub.session():
        repos = hub.publish(items)
    for repo_id, check in repos.items():
        print(f"  pushed {repo_id} ({check['url']}); loaded back by repo id: timm identical "
              f"{check['timm_identical']}, transformers identical {check['transformers_identical']}", flush=True)
    endpoint = "a Hub endpoint on 127.0.0.1 for the run" if hub.kind == "local" else hub.endpoint
    return dict(kind=hub.kind, endpoint=endpoint, repos={r: {k: v for k, v in c.items() if k != "url"}
                                                         for r, c in repos.items()})
