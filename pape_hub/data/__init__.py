"""Datasets: the built-in arrow task and real image datasets, behind one ``--dataset`` spec.

Specs: ``arrows`` (generated, no download), ``digits`` (scikit-learn's bundled 8x8 handwritten digits, grey, no
download), ``imagefolder:PATH``, ``hf:NAME`` (a Hugging Face dataset name or a ``save_to_disk`` folder),
``cifar:PATH`` (the CIFAR-10/100 python pickles); video: ``motion`` (generated) and ``videofolder:PATH``; point
clouds: ``shapes3d`` (generated) and ``modelnet:PATH``; event streams: ``movingdot`` (generated) and
``eventfolder:PATH``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset, Subset

from ..records import describe_spec
from .arrows import DIRECTIONS, ArrowConfig, ArrowDataset, arrow_statistics, paper_setting
from .event_streams import EventConfig, EventFileDataset, MovingDotDataset, load_event_folder
from .images import (
    TransformedDataset,
    channel_statistics,
    check_readable,
    load_cifar,
    load_digits,
    load_hf,
    load_imagefolder,
    stratified_split,
    subset,
)
from .point_clouds import PointFileDataset, ShapeConfig, ShapeDataset, load_modelnet
from .tasks import GENERATED_TASKS, GeneratedTask, generated_task
from .video import (
    MotionConfig,
    MotionDataset,
    VideoTransform,
    load_videofolder,
    motion_statistics,
    read_video,
)

__all__ = [
    "ArrowConfig", "ArrowDataset", "DATASET_SPECS", "DIGITS_INPUT", "DIRECTIONS", "DataBundle", "EventConfig",
    "FREE_TOKEN_SPECS", "GENERATED_TASKS", "GENERATED_TEST_SEED", "GENERATED_VAL_SEED", "GeneratedTask",
    "MotionConfig", "MotionDataset", "ShapeConfig", "TransformedDataset", "VIDEO_SPECS", "VideoTransform",
    "arrow_statistics", "build_data", "channel_statistics", "check_splits", "data_fingerprint", "describe_spec",
    "free_token_family", "generated_task", "is_video_spec", "motion_statistics", "paper_setting", "read_video",
    "split_members", "stratified_split",
]

DATASET_SPECS = ("arrows | digits | imagefolder:PATH | hf:NAME | cifar:PATH | motion | videofolder:PATH | shapes3d | "
                 "modelnet:PATH | movingdot | eventfolder:PATH")
#: the datasets of tokens at free coordinates -> the model family that reads them
FREE_TOKEN_SPECS = {"shapes3d": "pointvit", "modelnet": "pointvit", "movingdot": "eventvit", "eventfolder": "eventvit"}
#: how digits are shown to a model here (the digits results): the 8x8 grey images at 16 px in 2-px patches,
#: one channel, no augmentation (random crops, RandAugment and Mixup erase what an 8x8 digit holds)
DIGITS_INPUT: dict[str, Any] = dict(img_size=16, aug="none", model_kwargs=dict(patch_size=2, in_chans=1))
VIDEO_SPECS = ("motion", "videofolder")


def is_video_spec(spec: str) -> bool:
    return spec.partition(":")[0] in VIDEO_SPECS


def free_token_family(spec: str) -> str | None:
    """The model family (``pointvit`` / ``eventvit``) a dataset of tokens at free coordinates needs, else None."""
    return FREE_TOKEN_SPECS.get(spec.partition(":")[0])

GENERATED_VAL_SEED, GENERATED_TEST_SEED = 1_000_003, 2_000_003  # fixed, whatever the training seed


@dataclass
class DataBundle:
    train: Dataset
    val: Dataset
    test: Dataset | None
    classes: list[str]
    natural_images: bool  # photographs and the like: RandAugment, Mixup, CutMix apply (not generated tasks, video)
    description: dict[str, Any] = field(default_factory=dict)
    is_video: bool = False

    def with_transforms(self, train_transform: Any, eval_transform: Any) -> DataBundle:
        """The same splits of a dataset read from files (nothing is read again) with other transforms: the
        training split's, and the validation and test splits'."""
        def swap(split: Dataset | None, transform: Any) -> Dataset | None:
            if split is None:
                return None
            if isinstance(split, Subset):
                return subset(split.dataset.with_transform(transform), split.indices)
            return split.with_transform(transform)

        return replace(self, train=swap(self.train, train_transform), val=swap(self.val, eval_transform),
                       test=swap(self.test, eval_transform))


def build_data(spec: str, *, img_size: int, seed: int = 0, val_fraction: float = 0.1, train_size: int = 16384,
               eval_size: int = 2000, arrow_config: ArrowConfig | None = None, train_transform: Any = None,
               eval_transform: Any = None, image_column: str = "image", label_column: str = "label",
               channels: int = 3, normalize: str | tuple[float, float] | None = "auto",
               motion_config: MotionConfig | None = None, num_frames: int = 16,
               shapes_config: ShapeConfig | None = None, event_config: EventConfig | None = None,
               num_points: int = 1024) -> DataBundle:
    """The train / validation / test splits of ``spec``. Images are read with ``channels`` (1 or 3) channels;
    ``normalize`` applies to the generated tasks only (their samples are tensors already; image and video datasets
    normalise in their transforms). ``num_frames``: frames sampled from each clip of a video folder; ``num_points``:
    points read per cloud of a ModelNet folder (``channels`` 3 or 6 there: xyz, or with the normals)."""
    kind, _, arg = spec.partition(":")
    if kind in FREE_TOKEN_SPECS:
        return free_token_splits(spec, seed=seed, val_fraction=val_fraction, train_size=train_size,
                                 eval_size=eval_size, shapes_config=shapes_config, event_config=event_config,
                                 num_points=num_points, channels=channels)
    task = generated_task(spec)
    if task is not None:  # samples are made from a seed: validation and test use fixed seeds of their own
        cfg = {"arrows": arrow_config, "motion": motion_config}[task.name] or task.setting()
        if cfg.image_size != img_size:
            raise ValueError(f"the {kind} task renders {cfg.image_size}px images (grid {cfg.grid} x cell {cfg.cell}) "
                             f"but the model takes {img_size}px; pass matching --img-size or {kind} grid/cell")
        make = lambda n, s: task.dataset(n, cfg, seed=s, normalize=normalize, channels=channels)  # noqa: E731
        train = make(train_size, seed)
        return DataBundle(train, make(eval_size, GENERATED_VAL_SEED), make(eval_size, GENERATED_TEST_SEED),
                          train.classes, False, dict(spec=kind, train=train.describe(), val_seed=GENERATED_VAL_SEED,
                                      test_seed=GENERATED_TEST_SEED), is_video=task.is_video)
    if kind == "videofolder":
        if not arg:
            raise ValueError(f"dataset spec {spec!r} needs a path after the colon")
        full, val, test, classes = load_videofolder(arg, num_frames)
        return _file_splits(spec, full, val, test, classes, val_fraction, train_transform, eval_transform, channels,
                            natural_images=False, is_video=True, num_frames=num_frames)
    if kind == "digits":
        full, test, classes = load_digits()
        val = None
    elif kind in ("imagefolder", "hf", "cifar"):
        if not arg:
            raise ValueError(f"dataset spec {spec!r} needs a path or name after the colon")
        loaders = {"imagefolder": load_imagefolder, "cifar": lambda a: _no_validation(load_cifar(a)),
                   "hf": lambda a: load_hf(a, image_column=image_column, label_column=label_column)}
        full, val, test, classes = loaders[kind](arg)
    else:
        raise ValueError(f"unknown dataset spec {spec!r}; use {DATASET_SPECS}")
    return _file_splits(spec, full, val, test, classes, val_fraction, train_transform, eval_transform, channels)


def free_token_splits(spec: str, *, seed: int, val_fraction: float, train_size: int, eval_size: int,
                      shapes_config: ShapeConfig | None, event_config: EventConfig | None, num_points: int,
                      channels: int) -> DataBundle:
    """The splits of a point-cloud or event dataset: a generated task's from seeds (validation and test from fixed
    seeds of their own), or files' (a stratified validation cut where the folder has no validation split)."""
    kind, _, arg = spec.partition(":")
    if kind in ("shapes3d", "movingdot"):
        make_set = (lambda n, s: ShapeDataset(n, shapes_config or ShapeConfig(), seed=s)) if kind == "shapes3d" \
            else (lambda n, s: MovingDotDataset(n, event_config or EventConfig(), seed=s))
        train = make_set(train_size, seed)
        return DataBundle(train, make_set(eval_size, GENERATED_VAL_SEED), make_set(eval_size, GENERATED_TEST_SEED),
                          train.classes, False, dict(spec=kind, train=train.describe(), val_seed=GENERATED_VAL_SEED,
                                                     test_seed=GENERATED_TEST_SEED))
    if not arg:
        raise ValueError(f"dataset spec {spec!r} needs a path after the colon")
    if kind == "modelnet":
        full, test = load_modelnet(arg, num_points=num_points, channels=channels)
        held_out = None
    else:
        full, held_out, test = load_event_folder(arg)
    if held_out is None:
        train_idx, val_idx = stratified_split(full.labels, val_fraction, seed=0)
        train, val = Subset(full, train_idx), Subset(full, val_idx)
        origin = f"a {val_fraction:g} cut of the training split"
    else:
        train, val, origin = full, held_out, "its own validation split"
    return DataBundle(train, val, test, full.classes, False,
                      dict(spec=describe_spec(spec), train=len(train), val=len(val), test=len(test) if test else 0,
                           val_from=origin, **({"num_points": num_points} if kind == "modelnet" else {})))


def _no_validation(splits: tuple[Any, Any, list[str]]) -> tuple[Any, None, Any, list[str]]:
    """(train, test, classes) of a loader without a validation split -> (train, None, test, classes)."""
    train, test, classes = splits
    return train, None, test, classes


def _file_splits(spec: str, full: Any, held_out: Any, test: Any, classes: list[str], val_fraction: float,
                 train_transform: Any, eval_transform: Any, channels: int, natural_images: bool = True,
                 is_video: bool = False, **facts: Any) -> DataBundle:
    """The splits of a dataset read from files: its own validation split (a ``validation/`` or ``val/`` folder, a
    ``validation`` split) if it has one, else a stratified ``val_fraction`` cut of the training split; the test
    split as it is (None without one). ``description`` says where the validation images came from."""
    if held_out is not None:
        train = full.with_transform(train_transform, channels)
        val = held_out.with_transform(eval_transform, channels)
        sizes, origin = dict(train=len(full), val=len(held_out)), "its own validation split"
    else:
        train_idx, val_idx = stratified_split(full.labels, val_fraction, seed=0)
        train = subset(full.with_transform(train_transform, channels), train_idx)
        val = subset(full.with_transform(eval_transform, channels), val_idx)
        sizes, origin = dict(train=len(train_idx), val=len(val_idx)), f"a {val_fraction:g} cut of the training split"
    test_ds = test.with_transform(eval_transform, channels) if test is not None else None
    return DataBundle(train, val, test_ds, classes, natural_images,
                      dict(spec=describe_spec(spec), **sizes, test=len(test) if test else 0, val_from=origin, **facts),
                      is_video=is_video)


def split_members(split: Dataset | None) -> list[str]:
    """What a split holds, one line per sample: its file as ``class folder/name`` and label where it has files (so a
    moved dataset folder is the same data), else its index and label; generated splits: nothing (their description
    says all)."""
    if split is None:
        return []
    base, indices = (split.dataset, list(split.indices)) if isinstance(split, Subset) else (split, None)
    if isinstance(base, (PointFileDataset, EventFileDataset)):  # point and event files
        picked = range(len(base)) if indices is None else indices
        return [f"{'/'.join(Path(base.files[i]).parts[-2:])}\t{base.labels[i]}" for i in picked]
    if not isinstance(base, TransformedDataset):
        return []
    indices = range(len(base)) if indices is None else indices
    labels = base.labels if base.labels is not None else [None] * len(base)
    if base.source is None:
        return [f"{i}\t{labels[i]}" for i in indices]
    return [f"{'/'.join(Path(base.source(i)).parts[-2:])}\t{labels[i]}" for i in indices]


def data_fingerprint(data: DataBundle) -> dict[str, Any]:
    """A record of which samples are in which split (sizes and a hash of the members), which a resumed run compares:
    images added to a folder would re-cut the validation split, so that trained-on images were validated on."""
    import hashlib

    record: dict[str, Any] = {"description": json.loads(json.dumps(data.description, default=str))}
    for name, split in (("train", data.train), ("val", data.val), ("test", data.test)):
        members = split_members(split)
        record[name] = dict(count=0 if split is None else len(split),
                            sha256=hashlib.sha256("\n".join(members).encode()).hexdigest())
    return record


def check_splits(data: DataBundle) -> None:
    """Before training: every validation and test sample decoded (they are scored after each epoch, so a broken file
    there would stop the run only after an epoch of work), and every training file's header opened; one error names
    the first unreadable file. A training image broken past its header stops the run at that image, naming it."""
    for split, full in ((data.val, True), (data.test, True), (data.train, False)):
        if split is not None:
            check_readable(split, full)
