"""Several encodings on one dataset (several seeds each, in parallel worker processes), then every best checkpoint
scored every best checkpoint at the training resolution and at larger ones, with and without position interpolation,
plus the patch-shuffle test. Writes a table over seeds (mean ± std), a JSON with every run and a plot.

Presets hold the model and recipe of the built-in datasets; every value can be overridden by a flag.
``digits`` (scikit-learn's 8x8 grey digits, upsampled to 16 px, patch 2, one input channel, no augmentation,
30 epochs) is evaluated at 16, 24 and 32 px (1x, 1.5x, 2x). ``motion`` (the built-in video task: which way does
the moving square go; a ViViT of width 96, depth 4, tubelets 2 x 8 x 8) is trained on 6-frame clips of 5 x 5 cells
and evaluated on larger boards (6x7: 7 x 7 cells) and longer clips (10x5: 10 frames).

Examples:
    python -m lab compare --dataset digits                           # results/digits
    python -m lab compare --dataset motion                           # results/video_motion
    python -m lab compare --dataset digits --encodings ape,pape --seeds 0 --aug light --hflip 0 --results-dir none
    python -m lab compare --dataset imagefolder:/data/pets --img-size 64 --resolutions 64,96,128 \\
        --model-kwargs '{"patch_size": 8}' --epochs 50
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pape_hub.commands import add_config_arguments, config_values
from pape_hub.data import DIGITS_INPUT
from pape_hub.training import TrainConfig

SMALL_VIT = dict(embed_dim=96, depth=4, num_heads=4, global_pool="avg", class_token=False)
#: dataset -> model, recipe and evaluation defaults (``clips``: a video sweep, ``resolutions``: an image sweep)
PRESETS: dict[str, dict[str, Any]] = {
    "digits": dict(model="vit_t4_{encoding}", model_kwargs=dict(SMALL_VIT, **DIGITS_INPUT["model_kwargs"]),
                   img_size=DIGITS_INPUT["img_size"], resolutions=[16, 24, 32], epochs=30, batch_size=64, lr=1e-3,
                   warmup_epochs=3, weight_decay=0.05, label_smoothing=0.1, drop_path=0.1, aug=DIGITS_INPUT["aug"],
                   results_dir="results/digits"),
    "motion": dict(model="vivit_t16_{encoding}", model_kwargs=dict(SMALL_VIT, tubelet_size=[2, 8, 8]), img_size=None,
                   clips=["6x5", "6x7", "10x5"], epochs=5, train_size=4096, eval_size=1000, batch_size=64, lr=1e-3,
                   warmup_epochs=1, weight_decay=0.05, label_smoothing=0.0, drop_path=0.0, aug="none",
                   results_dir="results/video_motion"),
}
GENERIC = dict(model="vit_t4_{encoding}", model_kwargs=dict(SMALL_VIT), img_size=None, resolutions=None, epochs=30,
               batch_size=64, lr=1e-3, warmup_epochs=3, weight_decay=0.05, label_smoothing=0.1, drop_path=0.1,
               aug="default", results_dir="none")
DEFAULT_ENCODINGS = "none,ape,sincos,rope,rope_mixed,polar_rope,alibi,lookhere,pape,pape_ri,liere8"
#: TrainConfig settings a comparison takes from the command line (unset: the dataset preset's)
PRESET_SETTINGS = ("model_kwargs", "img_size", "train_size", "eval_size", "epochs", "batch_size", "lr",
                   "warmup_epochs", "weight_decay", "label_smoothing", "drop_path", "aug", "hflip", "color_jitter",
                   "mixup", "cutmix", "recipe")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="digits", help="arrows | digits | imagefolder:PATH | hf:NAME | "
                        "cifar:PATH (built-in presets: " + ", ".join(PRESETS) + ")")
    parser.add_argument("--encodings", default=None, help="comma-separated, or 'all'; arguments in brackets, e.g. "
                        "alibi[slope_scale=8] (default: every encoding defined for the data, 'lookhere' not for "
                        "video)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds")
    parser.add_argument("--model", default=None, help="timm name pattern, {encoding} replaced (default: the "
                        "preset's, vit_t4_{encoding} or vivit_t16_{encoding})")
    parser.add_argument("--resolutions", default=None, help="comma-separated evaluation sizes (default: preset's)")
    parser.add_argument("--clips", default=None, help="video: comma-separated FRAMESxSIZE evaluation clips, the "
                        "training clip first (default: the preset's)")
    add_config_arguments(parser, TrainConfig, only=PRESET_SETTINGS, preset_defaults=True)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes at once (one thread each)")
    parser.add_argument("--output-dir", default=None, help="checkpoints and logs (default outputs/compare_<data>)")
    parser.add_argument("--results-dir", default=None, help="table, JSON and plot (default: the preset's, e.g. "
                        "results/digits; 'none' to skip)")
    parser.add_argument("--resume", action="store_true", help="keep the runs a stopped run of this command completed "
                        "with the same settings (their folders under --output-dir) and train only the others")


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """The preset for ``args.dataset`` with every flag given on the command line applied."""
    kind = args.dataset.partition(":")[0]
    preset = dict(PRESETS.get(kind, GENERIC))
    if args.resolutions:
        preset["resolutions"] = [int(r) for r in args.resolutions.split(",")]
    if args.clips:
        preset["clips"] = args.clips.split(",")
    preset.update(config_values(args, TrainConfig, only=PRESET_SETTINGS))  # the settings given on the command line
    for name in ("model", "results_dir"):
        if getattr(args, name) is not None:
            preset[name] = getattr(args, name)
    if "clips" in preset:
        return preset
    if preset["img_size"] is None:
        raise ValueError(f"--img-size is needed for dataset {args.dataset!r} (no preset)")
    preset["resolutions"] = preset["resolutions"] or [preset["img_size"]]
    if preset["resolutions"][0] != preset["img_size"]:
        preset["resolutions"] = [preset["img_size"], *[r for r in preset["resolutions"] if r != preset["img_size"]]]
    return preset


def run(args: argparse.Namespace) -> int:
    from pape_hub.encodings import list_encodings
    from pape_hub.records import Evaluation

    from ..experiment import make_job, parse_encodings, run_comparison
    from ..provenance import provenance

    setup = resolve(args)
    default = DEFAULT_ENCODINGS if "clips" not in setup else DEFAULT_ENCODINGS.replace(",lookhere", "")
    specs = parse_encodings(args.encodings or default, list_encodings())
    seeds = [int(s) for s in args.seeds.split(",")]
    name = args.dataset.replace(":", "_").replace("/", "_")
    root = Path(args.output_dir or f"outputs/compare_{name}")
    video = "clips" in setup
    sizes = setup["clips"] if video else setup["resolutions"]
    recipe = {k: v for k, v in setup.items() if k not in ("resolutions", "clips", "results_dir", "model_kwargs",
                                                          "model")}
    sweep = dict(dataset=args.dataset, **({"clips": sizes} if video else {"resolutions": sizes}),
                 **({"eval_size": setup["eval_size"]} if "eval_size" in setup else {}))
    jobs = [dict(make_job(label, kwargs, seed, root, sweep=sweep,
                          train=dict(model=setup["model"].format(encoding=enc), model_kwargs=setup["model_kwargs"],
                                     dataset=args.dataset, quiet=False, overwrite=True, **recipe)),
                 reuse_complete=args.resume)
            for label, enc, kwargs in specs for seed in seeds]
    print(f"training {len(jobs)} model(s) on {args.dataset}, {setup['epochs']} epochs, {args.jobs} at a time; "
          f"evaluating at {sizes}; logs in {root}/", flush=True)

    def describe(result: Evaluation) -> str:
        test = result.train.get("test", {}).get("top1")
        return f"best val {result.train['best_val_top1']:.3f}" + (f", test {test:.3f}" if test is not None else "")

    results_dir = None if setup["results_dir"] == "none" else Path(setup["results_dir"])
    # the behaviour probes (a minute) only where a results file will record them
    facts = dict(provenance=provenance("compare", getattr(args, "command_line", None)) if results_dir else None,
                 dataset=args.dataset, model=dict(setup["model_kwargs"], name=setup["model"]), recipe=recipe)
    summary = run_comparison(jobs, args.jobs, describe, facts, sizes, "clip" if video else "px", results_dir,
                             title=f"{args.dataset}: trained at {sizes[0]}, mean and range over seeds {seeds}")
    print(f"wall time {summary.wall_s}s; checkpoints in {root}/<encoding>_seed<k>/best")
    return 1 if summary.failed else 0
