"""Datasets: the built-in arrow task and real image datasets, behind one ``--dataset`` spec.

Specs: ``arrows`` (generated, no download), ``imagefolder:PATH``, ``hf:NAME`` (a Hugging Face dataset name or a
``save_to_disk`` folder), ``cifar:PATH`` (the CIFAR-10/100 python pickles).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import Dataset

from .arrows import ArrowConfig, ArrowDataset, paper_setting
from .images import TransformedDataset, load_cifar, load_hf, load_imagefolder, stratified_split, subset

__all__ = [
    "ARROW_TEST_SEED", "ARROW_VAL_SEED", "ArrowConfig", "ArrowDataset", "DataBundle", "build_data", "paper_setting",
    "TransformedDataset", "stratified_split",
]

ARROW_VAL_SEED, ARROW_TEST_SEED = 1_000_003, 2_000_003  # fixed, whatever the training seed


@dataclass
class DataBundle:
    train: Dataset
    val: Dataset
    test: Dataset | None
    classes: list[str]
    is_images: bool  # natural images: RandAugment / Mixup / CutMix apply (never for the arrow task)
    description: dict[str, Any] = field(default_factory=dict)


def build_data(spec: str, *, img_size: int, seed: int = 0, val_fraction: float = 0.1, train_size: int = 16384,
               eval_size: int = 2000, arrow_config: ArrowConfig | None = None, train_transform: Any = None,
               eval_transform: Any = None, image_column: str = "image", label_column: str = "label") -> DataBundle:
    kind, _, arg = spec.partition(":")
    if kind == "arrows":
        cfg = arrow_config or ArrowConfig()
        if cfg.image_size != img_size:
            raise ValueError(f"the arrow task renders {cfg.image_size}px images (grid {cfg.grid} x cell {cfg.cell}) "
                             f"but the model takes {img_size}px; pass matching --img-size or arrow grid/cell")
        train = ArrowDataset(train_size, cfg, seed=seed)
        return DataBundle(train, ArrowDataset(eval_size, cfg, ARROW_VAL_SEED),
                          ArrowDataset(eval_size, cfg, ARROW_TEST_SEED), train.classes, False,
                          dict(train=train.describe(), val_seed=ARROW_VAL_SEED, test_seed=ARROW_TEST_SEED))
    if kind == "imagefolder":
        full, test, classes = load_imagefolder(arg)
    elif kind == "hf":
        full, test, classes = load_hf(arg, image_column=image_column, label_column=label_column)
    elif kind == "cifar":
        full, test, classes = load_cifar(arg)
    else:
        raise ValueError(f"unknown dataset spec {spec!r}; use arrows, imagefolder:PATH, hf:NAME or cifar:PATH")
    if not arg:
        raise ValueError(f"dataset spec {spec!r} needs a path or name after the colon")
    train_idx, val_idx = stratified_split(full.labels, val_fraction, seed=0)
    train = subset(full.with_transform(train_transform), train_idx)
    val = subset(full.with_transform(eval_transform), val_idx)
    test_ds = test.with_transform(eval_transform) if test is not None else None
    return DataBundle(train, val, test_ds, classes, True,
                      dict(spec=spec, train=len(train_idx), val=len(val_idx), test=len(test) if test else 0))

