"""Evaluate a checkpoint: top-1/top-5, a resolution (or arrow-grid) sweep with and without position
interpolation (PaPE tables 5-7), and the patch-shuffle test (LieRE table 5)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from timm.data import create_transform
from torch.utils.data import DataLoader

from .checkpoint import atomic_write, check_output_path, load_checkpoint, record_outputs
from .data import (
    DATASET_SPECS,
    GENERATED_TEST_SEED,
    EventConfig,
    ShapeConfig,
    VideoTransform,
    build_data,
    describe_spec,
    free_token_family,
    generated_task,
    is_video_spec,
)
from .data.event_streams import MovingDotDataset
from .data.point_clouds import ShapeDataset, pad_collate
from .progress import Progress
from .records import EVALUATION_FILE, Evaluation, SweepRow, git_commit

__all__ = ["chance_level", "check_label_names", "evaluate_checkpoint", "evaluate_loader", "parse_clip",
           "plot_sweep_summary", "resolve_eval_target", "save_evaluation", "shuffle_tiles", "sweep_loaders",
           "write_json"]


@torch.no_grad()
def evaluate_loader(model: torch.nn.Module, loader: Any, accelerator: Any = None,
                    position_interpolation: bool | None = None, progress: str | None = None) -> dict[str, float]:
    """Top-1, top-5 and cross-entropy over a loader (gathered across processes); ``position_interpolation``
    overrides the model's setting for these calls; ``progress`` names a progress bar over the batches."""
    model.eval()
    correct1 = correct5 = loss_sum = count = 0.0
    main = accelerator is None or accelerator.is_main_process
    for images, labels in Progress(loader, desc=progress or "", enabled=progress is not None and main, unit="batch"):
        if position_interpolation is None:
            logits = model(images).float()
        else:  # a pape_hub model (not wrapped): the setting passed down for this call
            logits = model.forward_head(model.forward_features(images, position_interpolation)).float()
        if accelerator is not None:
            logits, labels = accelerator.gather_for_metrics((logits, labels))
        loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        correct1 += (top[:, 0] == labels).sum().item()
        correct5 += (top == labels[:, None]).any(-1).sum().item()
        count += labels.numel()
    return dict(top1=correct1 / max(count, 1), top5=correct5 / max(count, 1), loss=loss_sum / max(count, 1),
                count=int(count))


def shuffle_tiles(x: torch.Tensor, tile: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Permute the tiles of each sample at random: (B, C, H, W) images in (p, p) patches, or (B, C, T, H, W)
    clips in (t, h, w) tubelets. The content survives, the layout does not."""
    b, c, *sides = x.shape
    grid = [n // k for n, k in zip(sides, tile)]
    split = x.reshape(b, c, *[v for pair in zip(grid, tile) for v in pair])  # (B, C, g0, k0, g1, k1, ...)
    nd = len(grid)
    order = [0, *range(2, 2 + 2 * nd, 2), 1, *range(3, 3 + 2 * nd, 2)]  # (B, g..., C, k...)
    tiles = split.permute(order).reshape(b, -1, c, *tile)
    perm = torch.stack([torch.randperm(tiles.shape[1], generator=generator) for _ in range(b)])
    tiles = tiles[torch.arange(b)[:, None], perm].reshape(b, *grid, c, *tile)
    back = [0, nd + 1] + [v for i in range(nd) for v in (1 + i, nd + 2 + i)]  # (B, C, g0, k0, g1, k1, ...)
    return tiles.permute(back).reshape(x.shape)


class ShuffledLoader:
    def __init__(self, loader: DataLoader, tile: tuple[int, ...], seed: int = 0) -> None:
        self.loader, self.tile, self.generator = loader, tile, torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterable:
        for x, labels in self.loader:
            yield shuffle_tiles(x, self.tile, self.generator), labels


#: datasets a checkpoint's record names completely (no path): evaluation can default to them
SELF_CONTAINED = ("arrows", "motion", "digits")


def resolve_eval_target(checkpoint: str | Path, dataset: str | None) -> tuple[Path, str]:
    """(checkpoint folder, dataset spec) to evaluate. A training output folder means its ``best/``; no dataset means
    the one the checkpoint was trained on (when its record names it completely); a built-in task other than the
    one it was trained on is refused, naming both."""
    from .checkpoint import read_config

    folder = Path(checkpoint)
    if not (folder / "config.json").exists() and (folder / "best" / "config.json").exists():
        print(f"note: {folder} is a training output folder; evaluating its best checkpoint {folder / 'best'}")
        folder = folder / "best"
    trained = read_config(folder).get("pape_hub", {}).get("dataset", {})
    trained = trained.get("spec") if isinstance(trained, dict) else None
    if dataset is None:
        if trained not in SELF_CONTAINED:
            raise ValueError(f"{folder} was trained on {trained or 'an unrecorded dataset'!r}; name the dataset to "
                             f"evaluate on with --dataset ({DATASET_SPECS})")
        return folder, trained
    kind = dataset.partition(":")[0]
    if trained and trained != dataset and (kind in SELF_CONTAINED or trained in SELF_CONTAINED):
        raise ValueError(f"{folder} was trained on {trained!r}, not {dataset!r}: its classes and inputs belong to "
                         f"that task; pass --dataset {trained} (or omit --dataset)")
    return folder, dataset


def parse_clip(text: str | tuple[int, int]) -> tuple[int, int]:
    """``"8x6"`` -> (frames, size)."""
    if isinstance(text, (tuple, list)):
        return int(text[0]), int(text[1])
    frames, _, size = str(text).partition("x")
    try:
        return int(frames), int(size)
    except ValueError as err:
        raise ValueError(f"a clip size is FRAMESxSIZE (e.g. 8x6 or 16x224), got {text!r}") from err


def check_label_names(config: dict[str, Any], classes: list[str], dataset: str) -> None:
    """Refuse to score a checkpoint on a dataset whose classes are not the ones it was trained on, in order."""
    trained = config.get("label_names")
    if trained is not None and list(trained) != list(classes):
        differ = next((i for i, (a, b) in enumerate(zip(trained, classes)) if a != b), min(len(trained), len(classes)))
        raise ValueError(f"{dataset} has classes {classes[:8]}{'...' if len(classes) > 8 else ''} but the checkpoint "
                         f"was trained on {list(trained)[:8]}{'...' if len(trained) > 8 else ''} (first difference at "
                         f"index {differ}); its predictions would be scored against the wrong labels")


def evaluate_checkpoint(checkpoint: str | Path, dataset: str = "arrows", sizes: list[int] | None = None,
                        resolutions: list[int] | None = None, interpolation: str = "both", split: str | None = None,
                        batch_size: int = 256, eval_size: int = 2000, patch_shuffle: bool | str = True,
                        clips: list[str | tuple[int, int]] | None = None, progress: bool = True) -> Evaluation:
    """Sweep one checkpoint. Arrow task: ``sizes`` are grid sizes; image datasets: ``resolutions`` in pixels;
    video: ``clips`` as ``"FRAMESxSIZE"`` (motion task: size in cells; video folders: in pixels).

    Each size is scored without and with position interpolation (except the training size, where interpolation
    changes nothing), and the training size also with shuffled patches (tubelets for video;
    ``patch_shuffle="all"``: every size).

    Args:
        checkpoint: a checkpoint folder (:func:`~pape_hub.checkpoint.save_checkpoint`, training's ``best/``).
        dataset: a dataset spec as ``pape-hub train`` takes it (``arrows``, ``motion``, ``digits``,
            ``imagefolder:PATH``, ...); its classes must be the checkpoint's, by name and order.
        sizes: grid sizes of a generated task (default: the task's sweep).
        resolutions: image sizes in pixels of an image dataset (default: the training size and 1.5x, 2x).
        interpolation: ``"both"``, ``"on"`` or ``"off"``: score with position interpolation, without, or both.
        split: ``"test"`` or ``"validation"``; default the test split, or where the dataset has none its validation
            split, said and recorded as such (generated tasks: their test seed).
        batch_size: images or clips per forward.
        eval_size: samples generated per size for a generated task.
        patch_shuffle: also score the training size with the patches permuted (a model that uses positions falls
            to chance); ``"all"``: every size.
        clips: video sizes as ``"FRAMESxSIZE"`` or ``(frames, size)``.
        progress: a bar over each pass's batches and a line per pass.

    Example:
        >>> import pape_hub, timm
        >>> from pape_hub.evaluation import evaluate_checkpoint
        >>> model = timm.create_model("vit_m12_pape", num_classes=4)
        >>> folder = pape_hub.save_checkpoint(model, "untrained", label_names=["up", "right", "down", "left"])
        >>> result = evaluate_checkpoint(folder, "arrows", sizes=[4, 6], eval_size=64, progress=False)
        >>> [(row.size, row.interpolation, row.patch_shuffle) for row in result.rows]
        [(4, False, False), (4, False, True), (6, False, False), (6, True, False)]
    """
    model, config = load_checkpoint(checkpoint)
    model.eval()
    if free_token_family(dataset) is not None:  # point clouds, event streams: sweeps of their own kind
        return evaluate_free_tokens(model, config, checkpoint, dataset, sizes, split, batch_size, eval_size, progress)
    modes = {"both": [False, True], "on": [True], "off": [False]}[interpolation]
    tile = tuple(getattr(model.patch_embed, "tubelet_size", model.patch_embed.patch_size))
    trained_size = _trained_size(config, dataset, model.patch_embed.img_size[0])
    task = generated_task(dataset)
    rows: list[SweepRow] = []
    scored: list[str] = []
    for size, loader in sweep_loaders(model, config, dataset, sizes, resolutions, clips, split, batch_size,
                                      eval_size, scored):
        for interp in modes:
            if interp and size == trained_size and False in modes:
                continue  # at the training size interpolation scales positions by 1: the same numbers again
            rows.append(_score(model, loader, size, interp, progress))
        if patch_shuffle and (size == trained_size or patch_shuffle == "all"):
            rows.append(_score(model, ShuffledLoader(loader, tile), size, False, progress, shuffled=True))
    unit = task.unit if task else "clip (frames x px)" if is_video_spec(dataset) else "image size (px)"
    return Evaluation(rows, checkpoint=str(checkpoint), architecture=config["architecture"],
                      label=config.get("position_encoding"), dataset=describe_spec(dataset),
                      num_classes=model.num_classes,
                      split=(scored or [split])[0] if task is None else "generated test seed", sweep_unit=unit,
                      trained_at=trained_size, commit=git_commit())


def free_token_sweep(config: dict[str, Any], dataset: str, sizes: list[Any] | None, split: str | None,
                     eval_size: int) -> tuple[list[tuple[str, Any]], str, str]:
    """(size label, dataset) of each pass over point clouds or events, the sweep's unit, and the trained size.

    ``shapes3d``: point counts (default: 1/4, 1/2, 1 and 2 times the training's most points), each in the canonical
    pose and in random poses (rotated, and shifted by up to 0.5); ``movingdot``: speeds (default 0.5, 1, 2 times the
    training's, so crossings last twice, once and half as long), and the training speed with half the events; files:
    their test split (or validation, as :func:`split_to_score` says)."""
    kind = dataset.partition(":")[0]
    trained = config.get("pape_hub", {}).get("dataset", {}).get("train", {})
    if kind == "shapes3d":
        base = ShapeConfig(**{k: v for k, v in trained.items() if k in ShapeConfig.__dataclass_fields__})
        counts = [int(v) for v in sizes] if sizes else [base.points // 4, base.points // 2, base.points,
                                                       base.points * 2]
        passes = []
        for n in counts:
            fixed = replace(base, points=n, min_points=n)
            passes += [(f"{n}", ShapeDataset(eval_size, fixed, GENERATED_TEST_SEED)),
                       (f"{n} rotated", ShapeDataset(eval_size, replace(fixed, rotate=True, translate=0.5),
                                                     GENERATED_TEST_SEED))]
        return passes, "points per cloud (canonical pose, or rotated and shifted)", f"{base.points}"
    if kind == "movingdot":
        base = EventConfig(**{k: v for k, v in trained.items() if k in EventConfig.__dataclass_fields__})
        speeds = [float(v) for v in sizes] if sizes else [0.5 * base.speed, base.speed, 2 * base.speed]
        passes = [(f"speed {v:g}", MovingDotDataset(eval_size, replace(base, speed=v), GENERATED_TEST_SEED))
                  for v in speeds]
        passes.append((f"speed {base.speed:g}, half the events",
                       MovingDotDataset(eval_size, replace(base, keep=base.keep / 2), GENERATED_TEST_SEED)))
        return passes, "speed of the dot (and a half-rate stream)", f"speed {base.speed:g}"
    if sizes:
        raise ValueError(f"--sizes sweeps a generated task; {dataset} is scored on its files as they are")
    args = config.get("model_args", {})
    data = build_data(dataset, img_size=0, channels=args.get("in_chans", 3),
                      num_points=int(config.get("pape_hub", {}).get("dataset", {}).get("num_points", 1024)))
    which = split_to_score(split, data, dataset)
    return [(which, data.test if which == "test" else data.val)], "split", which


def evaluate_free_tokens(model: torch.nn.Module, config: dict[str, Any], checkpoint: str | Path, dataset: str,
                         sizes: list[Any] | None, split: str | None, batch_size: int, eval_size: int,
                         progress: bool) -> Evaluation:
    """:func:`evaluate_checkpoint` of a point or event model (:func:`free_token_sweep`); no position interpolation
    or patch shuffle (the tokens carry their own coordinates)."""
    passes, unit, trained = free_token_sweep(config, dataset, sizes, split, eval_size)
    rows = []
    for size, ds in passes:
        check_label_names(config, ds.classes if hasattr(ds, "classes") else ds.dataset.classes, dataset)
        rows.append(_score(model, DataLoader(ds, batch_size=batch_size, collate_fn=pad_collate), size, None,
                           progress))
    generated = dataset in ("shapes3d", "movingdot")
    return Evaluation(rows, checkpoint=str(checkpoint), architecture=config["architecture"],
                      label=config.get("model_args", {}).get("position_encoding"), dataset=describe_spec(dataset),
                      num_classes=model.num_classes, split="generated test seed" if generated else passes[0][0],
                      sweep_unit=unit, trained_at=trained, commit=git_commit())


def sweep_loaders(model: torch.nn.Module, config: dict[str, Any], dataset: str, sizes: list[int] | None,
                  resolutions: list[int] | None, clips: list[Any] | None, split: str | None, batch_size: int,
                  eval_size: int, scored: list[str] | None = None) -> Iterable[tuple[Any, DataLoader]]:
    """(size, loader) of each size of a sweep, normalised as the checkpoint was trained: a generated task at the
    setting it was trained on (grids, or motion clips), video folders at ``clips``, images at ``resolutions``.
    The split scored (:func:`split_to_score`) is appended to ``scored``."""
    scored = [] if scored is None else scored
    scored.clear()
    native, channels = model.patch_embed.img_size[0], model.patch_embed.proj.in_channels
    mean, std = config["pretrained_cfg"]["mean"], config["pretrained_cfg"]["std"]  # what it was trained with
    task = generated_task(dataset)
    if task is not None:  # the setting the checkpoint was trained on, at each size of the sweep
        base = task.setting(config.get("pape_hub", {}).get("dataset", {}).get("train", {}))
        settings = task.sweep(base, [parse_clip(c) for c in clips or []] if task.is_video else sizes)
        for setting in fitting_settings(settings, model, task, explicit=bool(sizes or clips)):
            ds = task.dataset(eval_size, setting, seed=GENERATED_TEST_SEED, normalize=(mean, std), channels=channels)
            check_label_names(config, ds.classes, dataset)
            yield task.size_of(setting), DataLoader(ds, batch_size=batch_size)
        return
    video = is_video_spec(dataset)
    shapes = list(map(parse_clip, clips or [(model.patch_embed.num_frames, native)])) if video else \
        [(None, res) for res in resolutions or default_resolutions(native, model.patch_embed.patch_size[0])]
    for frames, res in shapes:
        tf = VideoTransform(res, mean, std) if video else create_transform(
            res, is_training=False, mean=mean, std=std, interpolation=model.pretrained_cfg["interpolation"],
            crop_pct=model.pretrained_cfg["crop_pct"])  # the checkpoint's own crop and resize
        data = build_data(dataset, img_size=res, eval_transform=tf, train_transform=tf, channels=channels,
                          **({"num_frames": frames} if video else {}))
        check_label_names(config, data.classes, dataset)
        if not scored:  # resolved once, on the first size's data
            scored.append(split_to_score(split, data, dataset))
        ds = data.test if scored[0] == "test" else data.val
        yield f"{frames}x{res}" if video else res, DataLoader(ds, batch_size=batch_size)


def fitting_settings(settings: list[Any], model: torch.nn.Module, task: Any, explicit: bool) -> list[Any]:
    """The settings whose images are whole patches of the model (a patch-16 model on 12 px arrow cells takes grids
    4, 8, 12 but not 6): the default sweep keeps those and says which it left out; sizes asked for explicitly that do
    not fit are refused, naming the ones that do."""
    tile = tuple(getattr(model.patch_embed, "tubelet_size", model.patch_embed.patch_size))[-1]
    def whole(s: Any) -> bool:  # every side of the images a whole number of patches (arrow grids: rows and columns)
        shapes = getattr(s, "image_shapes", [(s.image_size, s.image_size)])
        return all(side % tile == 0 for shape in shapes for side in shape)

    fits = [s for s in settings if whole(s)]
    left = [task.size_of(s) for s in settings if not whole(s)]
    if left and explicit:
        cell = settings[0].image_size // settings[0].grid
        step = tile // math.gcd(tile, cell)
        raise ValueError(f"sizes {left} make images that are not whole {tile}-px patches of the model ({cell}-px "
                         f"cells); use grids that are multiples of {step}")
    if left:
        print(f"note: leaving out sizes {left}: their images are not whole {tile}-px patches of the model", flush=True)
    if not fits:
        raise ValueError(f"no size of the sweep makes images of whole {tile}-px patches; pass --sizes")
    return fits


#: what ``--split`` accepts: the test split, or the validation split (``val`` is the same)
SPLITS = ("test", "validation", "val")


def split_to_score(split: str | None, data: Any, dataset: str) -> str:
    """``"test"`` or ``"validation"``: the split asked for, or without one the test split if the dataset has one,
    else its validation split (said once). A test split asked for where there is none is refused by name: the
    validation images chose the best epoch, so scoring them as "test" would be an optimistic number misnamed."""
    if split not in (None, *SPLITS):
        raise ValueError(f"--split {split!r} is not one of {', '.join(SPLITS)}")
    if split in ("validation", "val"):
        return "validation"
    if data.test is not None:
        return "test"
    if split == "test":
        raise ValueError(f"{describe_spec(dataset)} has no test split (an image folder needs root/test/<class>/ beside "
                         "root/train/); pass --split validation to score the validation images, which chose the best "
                         "epoch (an optimistic score, recorded as validation)")
    print(f"note: {describe_spec(dataset)} has no test split; scoring its validation split, which chose the best "
          "epoch (recorded as validation)", flush=True)
    return "validation"


def default_resolutions(native: int, patch: int) -> list[int]:
    """Where an image model is compared by default (``python -m lab compare``'s digits preset): 1x, 1.5x and 2x its
    training size, in whole patches."""
    return list(dict.fromkeys([native, round(1.5 * native / patch) * patch, 2 * native]))


def _score(model: torch.nn.Module, loader: Iterable, size: Any, interp: bool | None, progress: bool,
           shuffled: bool = False) -> SweepRow:
    """One pass of a sweep as a row (a progress bar over its batches and a line when done, if ``progress``);
    ``interp`` None: the model's plain forward (a model without position interpolation, as point and event models)."""
    what = f"size {size}" + (" interp." if interp else "") + (" shuffled" if shuffled else "")
    started = time.time()
    metrics = evaluate_loader(model, loader, position_interpolation=interp, progress=what if progress else None)
    if progress:
        print(f"  {what}: top-1 {metrics['top1']:.4f} ({time.time() - started:.1f}s)", flush=True)
    return SweepRow(size, bool(interp), metrics["top1"], metrics["top5"], metrics["loss"], metrics["count"], shuffled)


def _trained_size(config: dict[str, Any], dataset: str, native: int) -> int | str:
    task = generated_task(dataset)
    if task is not None:
        return task.size_of(task.setting(config.get("pape_hub", {}).get("dataset", {}).get("train", {})))
    if is_video_spec(dataset):
        return f"{config['model_args']['num_frames']}x{native}"
    return native


#: classes of the built-in datasets that are not generated tasks, for evaluations written before ``num_classes``
#: was recorded (a generated task names its own)
BUILTIN_CLASSES = {"digits": 10}
_MARKERS = "osD^vP*Xh<>p"


def chance_level(result: Evaluation) -> float | None:
    """1 / number of classes: recorded by :func:`evaluate_checkpoint`, else known for a built-in task."""
    task = generated_task(str(result.dataset))
    classes = result.num_classes or (len(task.dataset_class.label_names) if task else
                                     BUILTIN_CLASSES.get(str(result.dataset)))
    return 1.0 / classes if classes else None


def _sweep(runs: list[Evaluation], interp: bool) -> tuple[list[Any], list[list[float]]]:
    """(sizes in the sweep's own order, every run's top-1 at each size) without shuffled patches."""
    sizes = list(dict.fromkeys(s for r in runs for s in r.sizes() if r.row(s, interp)))
    return sizes, [[v for r in runs if (v := r.accuracy(s, interp)) is not None] for s in sizes]


BOOTSTRAP_RESAMPLES = 10_000


def bootstrap_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (seeds): the mean of ``len(values)`` draws with
    replacement, :data:`BOOTSTRAP_RESAMPLES` times, from a fixed generator (the same interval on every machine).
    With 3 seeds it is close to their range (all three draws equal the lowest with probability 1/27 > 2.5%); with
    5 it is narrower than the range. The comparisons' tables and plots both show it."""
    import numpy as np

    draws = np.random.default_rng(0).choice(np.asarray(values, dtype=float), size=(BOOTSTRAP_RESAMPLES, len(values)))
    low, high = np.quantile(draws.mean(axis=1), [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def plot_sweep_summary(results: list[Evaluation], path: str | Path, title: str = "") -> None:
    """Accuracy against sweep size per encoding (one evaluation or several seeds each): the mean over seeds with the
    95% bootstrap interval of the mean as a bar (:func:`bootstrap_interval`, as the comparisons' tables give it).
    Each encoding has its colour and marker, with no colour repeated; where several encodings share the plot, each
    sits a little to the side of the others so that equal curves stay visible (one encoding stays on its sizes).
    Solid filled markers: no interpolation, dashed open markers: position interpolation, named once in the legend.
    Chance level and the training size are grey reference lines drawn over the data; the legend is outside it."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure  # the object API: no pyplot state, no backend switched for the process
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(9, 4.8))
    ax = fig.subplots()
    encodings = list(dict.fromkeys(r.label for r in results))
    palette = colormaps["tab10" if len(encodings) <= 10 else "tab20"].colors
    every = list(dict.fromkeys(row.size for r in results for row in r.rows))
    numeric = all(isinstance(v, (int, float)) for v in every)
    position = {v: (v if numeric else i) for i, v in enumerate(every)}  # clip sizes ("6x5") sit at their index
    spread = min((b - a for a, b in zip(sorted(position.values()), sorted(position.values())[1:])), default=1)
    interpolated = False
    for index, enc in enumerate(encodings):
        runs = [r for r in results if r.label == enc]
        color, marker = palette[index % len(palette)], _MARKERS[index % len(_MARKERS)]
        dodge = (index - (len(encodings) - 1) / 2) * 0.3 * spread / len(encodings) if len(encodings) > 1 else 0.0
        for interp in (False, True):
            sizes, per_size = _sweep(runs, interp)
            if not sizes:
                continue
            interpolated |= interp
            means = [sum(v) / len(v) for v in per_size]
            bars = None
            if len(runs) > 1:  # the interval of the mean over seeds
                intervals = [bootstrap_interval(v) for v in per_size]
                bars = [[max(m - low, 0.0) for m, (low, _) in zip(means, intervals)],
                        [max(high - m, 0.0) for m, (_, high) in zip(means, intervals)]]
            ax.errorbar([position[s] + dodge for s in sizes], means, yerr=bars, ls="--" if interp else "-",
                        color=color, marker=marker, markersize=7 if interp else 5,
                        markerfacecolor="none" if interp else color, capsize=2, elinewidth=0.8, lw=1.2,
                        label=None if interp else enc)
    if interpolated:  # the two line styles, once each, instead of a second entry per encoding
        for label, style, face in (("no interpolation", "-", "gray"), ("position interpolation", "--", "none")):
            ax.add_line(Line2D([], [], color="gray", ls=style, marker="o", markerfacecolor=face, label=label))
    if results:
        chance = chance_level(results[0])
        if chance is not None:
            ax.axhline(chance, color="gray", lw=1.0, ls=":", label=f"chance (1/{round(1 / chance)})", zorder=3)
        trained = results[0].trained_at
        if trained in position:
            ax.axvline(position[trained], color="gray", lw=0.8, ls="-.", label="training size", zorder=3)
        ax.set_xlabel(results[0].sweep_unit)
    if not numeric:
        ax.set_xticks(list(position.values()), [str(v) for v in position])
    ax.set_ylabel("top-1 accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight", format="png")  # by content: a temporary name has no .png


def plot_training_curve(history: list[dict[str, Any]], path: str | Path, title: str = "") -> None:
    """Loss (training and validation) and validation top-1 per epoch of a run's history (``metrics.jsonl``)."""
    from matplotlib.figure import Figure

    epochs = [h["epoch"] + 1 for h in history]
    fig = Figure(figsize=(9, 3.6))
    loss, accuracy = fig.subplots(1, 2)
    loss.plot(epochs, [h["train_loss"] for h in history], marker="o", label="training loss")
    loss.plot(epochs, [h["val_loss"] for h in history], marker="s", label="validation loss")
    accuracy.plot(epochs, [h["val_top1"] for h in history], marker="o", color="C2", label="validation top-1")
    best = max(history, key=lambda h: h["val_top1"])
    accuracy.axvline(best["epoch"] + 1, color="gray", ls=":", label=f"best epoch ({best['epoch'] + 1})")
    accuracy.set_ylim(0, 1.02)
    for ax, name in ((loss, "loss"), (accuracy, "top-1")):
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")  # by content: a temporary name has no .png


def save_evaluation(result: Evaluation, checkpoint: str | Path, output: str | Path | None = None
                    ) -> tuple[Path, Path]:
    """Write an evaluation and its plot: into the checkpoint folder (``eval.json`` and the plot its model card
    shows), or to ``output`` with the plot beside it as ``.png``. Returns (json, plot)."""
    from .card import PLOT_NAME

    path = check_output_path(output) if output else Path(checkpoint) / EVALUATION_FILE
    plot = check_output_path(path.with_suffix(".png")) if output else Path(checkpoint) / PLOT_NAME
    # each through a temporary file and a rename: a full disk leaves the previous evaluation and plot whole
    atomic_write(plot, lambda tmp: plot_sweep_summary([result], tmp, title=f"{result.architecture} ({result.label})"))
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(result.to_dict(), indent=2)))
    if not output:
        record_outputs(checkpoint, path.name, plot.name)  # a later save of the checkpoint may replace them
    return path, plot


def write_json(obj: Any, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2))

