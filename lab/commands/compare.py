"""Several encodings on one dataset (several seeds each, in parallel worker processes), then every best checkpoint
scored at the training resolution and at larger ones, with and without position interpolation, plus the
patch-shuffle test. Writes a table over seeds (mean and a bootstrap interval), a JSON with every run and a plot.

Presets hold the model and recipe of the built-in datasets; every value can be overridden by a flag. ``digits``
(scikit-learn's 8x8 grey digits, upsampled to 16 px; the micro ViT with 2-px patches and one input channel, no
augmentation, 30 epochs) is evaluated at 16, 24 and 32 px (1x, 1.5x, 2x). ``motion`` (the built-in video task:
which way does the moving square go; a ViViT of the micro ViT's size with tubelets 2 x 8 x 8) is trained on
6-frame clips of 5 x 5 cells and evaluated on larger boards (6x7: 7 x 7 cells) and longer clips (10x5: 10 frames).
The default encodings are the main job's; the README's tables name theirs in the commands that wrote them.

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

from .. import REPOSITORY
from ..experiment import add_comparison_arguments, compare_encodings, small_vit

#: dataset -> model, recipe and evaluation defaults (``clips``: a video sweep, ``resolutions``: an image sweep);
#: ``model_kwargs`` are added to the comparisons' small ViT (:func:`~lab.experiment.small_vit`)
PRESETS: dict[str, dict[str, Any]] = {
    "digits": dict(model="vit_m12_{encoding}", model_kwargs=dict(patch_size=2, in_chans=1), img_size=16,
                   resolutions=[16, 24, 32], epochs=30, batch_size=64, lr=1e-3, warmup_epochs=3, weight_decay=0.05,
                   label_smoothing=0.1, drop_path=0.1, aug="none", results_dir="results/digits"),
    "motion": dict(model="vivit_t16_{encoding}", model_kwargs=dict(tubelet_size=[2, 8, 8]), img_size=None,
                   clips=["6x5", "6x7", "10x5"], epochs=5, train_size=4096, eval_size=1000, batch_size=64, lr=1e-3,
                   warmup_epochs=1, weight_decay=0.05, label_smoothing=0.0, drop_path=0.0, aug="none",
                   results_dir="results/video_motion"),
}
GENERIC = dict(model="vit_m12_{encoding}", model_kwargs={}, img_size=None, resolutions=None, epochs=30,
               batch_size=64, lr=1e-3, warmup_epochs=3, weight_decay=0.05, label_smoothing=0.1, drop_path=0.1,
               aug="default", results_dir="none")
#: TrainConfig settings a comparison takes from the command line (unset: the dataset preset's)
PRESET_SETTINGS = ("model_kwargs", "img_size", "train_size", "eval_size", "epochs", "batch_size", "lr",
                   "warmup_epochs", "weight_decay", "label_smoothing", "drop_path", "aug", "hflip", "color_jitter",
                   "mixup", "cutmix", "recipe")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="digits", help="arrows | digits | imagefolder:PATH | hf:NAME | "
                        "cifar:PATH (built-in presets: " + ", ".join(PRESETS) + ")")
    add_comparison_arguments(parser, seeds="0,1,2", output_dir="outputs/compare_<dataset>",
                             results_dir="the preset's, e.g. results/digits", train_settings=PRESET_SETTINGS)
    parser.add_argument("--model", default=None, help="timm name pattern, {encoding} replaced (default: the "
                        "preset's, vit_m12_{encoding} or vivit_t16_{encoding})")
    parser.add_argument("--resolutions", default=None, help="comma-separated evaluation sizes (default: preset's)")
    parser.add_argument("--clips", default=None, help="video: comma-separated FRAMESxSIZE evaluation clips, the "
                        "training clip first (default: the preset's)")


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """The preset for ``args.dataset`` with every flag given on the command line applied."""
    from pape_hub.commands import config_values
    from pape_hub.training import TrainConfig

    kind = args.dataset.partition(":")[0]
    preset = dict(PRESETS.get(kind, GENERIC))
    preset["model_kwargs"] = dict(small_vit(), **preset["model_kwargs"])
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
    setup = resolve(args)
    video = "clips" in setup
    sizes = setup["clips"] if video else setup["resolutions"]
    name = args.dataset.replace(":", "_").replace("/", "_")
    recipe = {k: v for k, v in setup.items() if k not in ("resolutions", "clips", "results_dir", "model_kwargs",
                                                          "model")}
    sweep = dict(dataset=args.dataset, **({"clips": sizes} if video else {"resolutions": sizes}),
                 **({"eval_size": setup["eval_size"]} if "eval_size" in setup else {}))
    train = dict(recipe, model=setup["model"], model_kwargs=setup["model_kwargs"], dataset=args.dataset, quiet=False,
                 overwrite=True)
    results = setup["results_dir"]
    results_dir = None if results == "none" else Path(results) if Path(results).is_absolute() or args.results_dir \
        else REPOSITORY / results
    facts = dict(dataset=args.dataset, model=dict(setup["model_kwargs"], name=setup["model"]), recipe=recipe)
    return compare_encodings(args, "compare", train, sweep, sizes, "clip" if video else "px",
                             Path(args.output_dir or f"outputs/compare_{name}"), results_dir,
                             f"{args.dataset}: trained at {sizes[0]}", facts)
