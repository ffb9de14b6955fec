r"""Trains encodings on the built-in arrow task (LieRE section 5.2), evaluates each on larger grids than it saw (with
and without position interpolation, and with shuffled patches), and writes a table over seeds (mean and a bootstrap
interval), a plot, and a checkpoint with a model card per encoding, pushed to a Hub and loaded back from it by repo
id.

Default: ape, rope_mixed, pape, pape_ri, liere8, alibi, seeds 0 to 4, on the easy setting (grid 4, cell 12 px =
patch, 4 balanced arrows, no letters, no hard negatives), the micro ViT vit_m12_* (width 96, depth 4, 4 heads,
average pooling), 5 epochs of 12,288 images, two single-thread worker processes; evaluation on grids 4, 6 and 8
(2,000 test images each). The wall time of the last run is in results/arrows_main_job/summary.json (wall_s); a
progress bar counts the epochs of all runs. In --init-from, {seed} is replaced by the run's seed.

Examples:
    python -m lab arrows                                   # the main job (results/arrows_main_job)
    python -m lab arrows --full                            # every encoding, twice the schedule (results/arrows_full)
    python -m lab arrows --encodings rope,rope_mixed --seeds 0 --results-dir none
    python -m lab arrows --paper --epochs 40               # the LieRE paper's harder setting
    python -m lab arrows --encodings pape --epochs 1 --init-from outputs/src/ape_seed{seed}/best  # transplant
    python -m lab arrows --cards-only                      # model_cards/ again, e.g. after a bench run
    python -m lab arrows --native --hub none               # native-resolution training (results/arrows_native)
    python -m lab arrows --aspect --resume --output-dir outputs/arrows --hub none  # the main job's runs, other aspects
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from pape_hub.records import Comparison

from .. import REPOSITORY
from ..experiment import add_comparison_arguments, compare_encodings, small_vit

#: the training shapes of ``--native``: 15 to 18 cells (the default 4x4 grid has 16), aspect ratios 1, 5:3 and 2
NATIVE_SHAPES = "4x4,3x5,5x3,3x6,6x3"
#: ``--aspect``'s evaluation grids: the default sweep, then aspect ratios 2 (one seen by --native, at other sizes) and
#: 4 (seen by neither)
ASPECT_GRIDS = "4,6,8,4x8,8x4,2x8,8x2"
SETTINGS = {
    "default": dict(grid=4, cell=12, num_arrows=4, num_letters=0, hard_negatives=0),
    "paper": dict(grid=9, cell=12, num_arrows=8, num_letters=5, hard_negatives=1),
    # control: no distractor arrow next to the Y, so finding the answer needs distance but not direction
    "isolated": dict(grid=4, cell=12, num_arrows=4, num_letters=0, hard_negatives=0, isolated=True),
    # native resolution: the default task's images at five shapes of aspect ratio 1 to 2, each at its own size
    "native": dict(grid=4, cell=12, num_arrows=4, num_letters=0, hard_negatives=0, shapes=NATIVE_SHAPES),
}
#: the task's recipe: what every run trains with unless a flag says otherwise
PRESET = dict(epochs=5, train_size=12288, eval_size=2000, batch_size=128, lr=2e-3, warmup_epochs=1, label_smoothing=0.0,
              drop_path=0.0, weight_decay=0.05, recipe="default", init_from=None)
FLAGS = ("epochs", "train_size", "eval_size", "recipe", "init_from")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_comparison_arguments(parser, seeds="0,1,2,3,4", train_settings=FLAGS,
                             output_dir="outputs/ + the results folder's name, outputs/arrows for the main job, "
                             "outputs/arrows_no_results with --results-dir none",
                             results_dir="results/arrows_main_job, results/arrows_full with --full, "
                             "results/arrows_paper with --paper, results/arrows_native with --native, "
                             "results/arrows_aspect with --aspect, each + _RECIPE for another --recipe")
    parser.add_argument("--full", action="store_true", help="every encoding, twice the schedule")
    parser.add_argument("--paper", action="store_true", help="LieRE's setting: grid 9, 8 arrows, letters, hard negs")
    parser.add_argument("--isolated", action="store_true",
                        help="control setting: no distractor arrow next to the Y (direction is not needed)")
    parser.add_argument("--native", action="store_true",
                        help=f"native-resolution training: the default task at shapes {NATIVE_SHAPES}, each image at "
                        "its own size and aspect ratio, batched as padded token sequences (pape-hub train "
                        "--native-resolution); evaluated at --aspect's grids; results/arrows_native")
    parser.add_argument("--aspect", action="store_true",
                        help=f"evaluate at grids {ASPECT_GRIDS} (other aspect ratios); with --resume and the main "
                        "job's --output-dir outputs/arrows, its checkpoints are scored again without training")
    parser.add_argument("--eval-grids", default=None, help="comma-separated grids, ROWSxCOLUMNS for other aspect "
                        "ratios (default: train grid, +2, +4)")
    parser.add_argument("--hub", choices=["auto", "local", "real", "none"], default="auto",
                        help="where the seed-0 checkpoints are pushed and loaded back from: 'auto' = the Hub your "
                        "token points at if one is configured, else a Hub endpoint started on 127.0.0.1")
    parser.add_argument("--hub-namespace", default="pape-hub", help="user or organisation of the pushed repos")
    parser.add_argument("--cards-only", action="store_true",
                        help="train nothing: write the main job's model cards (model_cards/) again from its results "
                        "and first-seed checkpoints, e.g. after `python -m lab bench` changed the speed they quote")


def run_setting(args: argparse.Namespace) -> tuple[str, dict[str, Any], dict[str, Any], Path | None, Path]:
    """(setting name, task setting, training preset with the flags applied, results folder or None, checkpoints
    folder). Each setting and recipe has folders of its own, so that no run overwrites the main job's checkpoints
    (the ones its model cards describe)."""
    if sum((args.paper, args.isolated, args.native)) > 1:
        raise ValueError("--paper, --isolated and --native are different settings; choose one")
    name = "paper" if args.paper else "isolated" if args.isolated else "native" if args.native else "default"
    preset = dict(PRESET, epochs=10 if args.full else PRESET["epochs"], native_resolution=args.native)
    preset.update({k: getattr(args, k) for k in FLAGS if getattr(args, k) is not None})
    variant = "full" if args.full else ("aspect" if args.aspect else "main_job") if name == "default" else name
    recipe = "" if preset["recipe"] == "default" else "_" + preset["recipe"].replace("-", "_")
    results = args.results_dir or str(REPOSITORY / "results" / f"arrows_{variant}{recipe}")
    # outputs/arrows holds the main job's checkpoints only (its cards describe them); other runs keep theirs beside
    # it, under their results folder's name
    named = "arrows_no_results" if results == "none" else Path(results).name.replace("arrows_main_job", "arrows")
    output = Path(args.output_dir or "outputs/" + named)
    return name, SETTINGS[name], preset, None if results == "none" else Path(results), output


def arrow_training(setting: dict[str, Any], preset: dict[str, Any]) -> dict[str, Any]:
    """The TrainConfig fields of an arrow-task run (``{encoding}`` in the model name) in ``setting`` with
    ``preset``'s recipe: the micro ViT, a patch per cell."""
    patch = {} if setting["cell"] == 12 else {"patch_size": setting["cell"]}
    return dict(preset, model="vit_m12_{encoding}", model_kwargs=patch, dataset="arrows", arrow=setting, quiet=False,
                overwrite=True)


def run(args: argparse.Namespace) -> int:
    from pape_hub.recipes import get_recipe

    setting_name, setting, preset, results_dir, output_dir = run_setting(args)
    if args.cards_only:
        return rewrite_cards(results_dir, args.hub_namespace)
    get_recipe(preset["recipe"])  # an unknown recipe fails here, before any worker starts
    if args.full:
        args.encodings = "all"
    from pape_hub.commands.eval import grids as parse_grids

    grids = parse_grids(args.eval_grids) or (parse_grids(ASPECT_GRIDS) if args.aspect or args.native else
                                             [setting["grid"], setting["grid"] + 2, setting["grid"] + 4])
    hub = None
    if args.hub != "none":
        from ..publish import HubTarget

        hub = HubTarget.resolve(args.hub, args.hub_namespace)  # token / endpoint problems surface before training
    train = arrow_training(setting, preset)
    main_job = results_dir is not None and results_dir.resolve() == REPOSITORY / "results" / "arrows_main_job"
    cards_dir = REPOSITORY / "model_cards" if main_job else None
    facts = dict(task=dict(setting=setting_name, **setting), model=dict(small_vit(), patch_size=setting["cell"]),
                 recipe={k: v for k, v in train.items() if k not in ("model", "model_kwargs", "arrow")},
                 epochs=preset["epochs"], train_size=preset["train_size"], eval_size=preset["eval_size"])
    return compare_encodings(args, "arrows", train, dict(dataset="arrows", sizes=grids, eval_size=preset["eval_size"]),
                             grids, "grid", output_dir, results_dir,
                             f"arrow task ({setting_name}), trained on grid {grids[0]}", facts,
                             publish=None if hub is None else lambda summary: publish(summary, hub, cards_dir,
                                                                                      repo_prefix(setting_name)))


def rewrite_cards(results_dir: Path | None, namespace: str) -> int:
    """``--cards-only``: the main job's cards from ``results_dir/summary.json`` and the checkpoints it names."""
    from pape_hub.records import read_record

    main_job = REPOSITORY / "results" / "arrows_main_job"
    if results_dir is None or results_dir.resolve() != main_job:
        raise ValueError("--cards-only writes the main job's cards from results/arrows_main_job: drop --results-dir, "
                         "--full, --paper, --isolated and --recipe")
    summary = read_record(main_job / "summary.json", Comparison.from_dict)
    missing = [run.checkpoint for run in summary.runs if run.seed == summary.seeds[0]
               and not (REPOSITORY / run.checkpoint).is_dir()]
    if missing:
        raise FileNotFoundError(f"--cards-only needs the main job's checkpoints, missing: {', '.join(missing)}; "
                                "`python -m lab arrows` writes them")
    # the main job records its checkpoints relative to where it ran: the checkout (`make main`)
    for _, repo_id in write_cards(summary, namespace, REPOSITORY / "model_cards", base=REPOSITORY):
        print(f"  wrote the card of {repo_id}", flush=True)
    return 0


def repo_prefix(setting_name: str) -> str:
    """The pushed repos' names before the encoding: the main job's ``vit-arrows-``, another setting's own (its repos
    never replace the main job's on a real Hub)."""
    return "vit-arrows-" if setting_name == "default" else f"vit-arrows-{setting_name}-"


def write_cards(summary: Comparison, namespace: str, cards_dir: Path | None,
                base: Path = Path("."), prefix: str = "vit-arrows-") -> list[tuple[Path, str]]:
    """Give each encoding's first-seed checkpoint (``base / run.checkpoint``) its evaluation, plot and model card
    (also written to ``cards_dir``, the repository's ``model_cards/``); (checkpoint, repo id) of each."""
    from pape_hub.card import PLOT_NAME, card_from_folder
    from pape_hub.checkpoint import record_outputs
    from pape_hub.evaluation import plot_sweep_summary, write_json
    from pape_hub.records import COMPARISON_FILE, EVALUATION_FILE, ComparisonContext

    first_seed = summary.seeds[0]
    bench_file = REPOSITORY / "results" / "bench_vit_b16_224_cpu.json"  # the encodings' speed at ViT-B, if measured
    bench = json.loads(bench_file.read_text()) if bench_file.exists() else None
    items = []
    for result in summary.runs:
        if result.seed != first_seed:
            continue
        checkpoint = base / result.checkpoint
        name = prefix + re.sub(r"[^A-Za-z0-9.]+", "-", result.label).strip("-")
        plot_sweep_summary([result], checkpoint / PLOT_NAME, title=f"{result.label}, seed {result.seed} (this "
                           f"checkpoint), trained on grid {summary.sizes[0]}")
        write_json(result.to_dict(), checkpoint / EVALUATION_FILE)  # this run's evaluation, as the comparison has it
        ComparisonContext(summary.seeds, summary.aggregate.get(result.label), bench).write(checkpoint)
        record_outputs(checkpoint, PLOT_NAME, EVALUATION_FILE, COMPARISON_FILE)
        card_from_folder(checkpoint, repo_id=f"{namespace}/{name}")
        if cards_dir is not None:
            cards_dir.mkdir(parents=True, exist_ok=True)
            (cards_dir / f"{name}.png").write_bytes((checkpoint / PLOT_NAME).read_bytes())
            card_from_folder(checkpoint, repo_id=f"{namespace}/{name}", path=cards_dir / f"{name}.md",
                             plot=f"{name}.png")
        items.append((checkpoint, f"{namespace}/{name}"))
    return items


def publish(summary: Comparison, hub: Any, cards_dir: Path | None, prefix: str = "vit-arrows-") -> dict[str, Any]:
    """Write each encoding's first-seed card (``write_cards``), push the checkpoints, and load each back by repo id
    from both faces (bit-identical logits to the local folder, checked in a fresh process)."""
    items = write_cards(summary, hub.namespace, cards_dir, prefix=prefix)
    with hub.session():
        repos = hub.publish(items)
    for repo_id, check in repos.items():
        print(f"  pushed {repo_id} ({check['url']}); loaded back by repo id: timm identical "
              f"{check['timm_identical']}, transformers identical {check['transformers_identical']}", flush=True)
    endpoint = "a Hub endpoint on 127.0.0.1 for the run" if hub.kind == "local" else hub.endpoint
    return dict(kind=hub.kind, endpoint=endpoint, repos={r: {k: v for k, v in c.items() if k != "url"}
                                                         for r, c in repos.items()})
