"""Real image datasets: an ImageFolder tree, a Hugging Face ``datasets`` name, and the CIFAR python pickles.

Every loader returns ``(train, test, classes)`` as lists of ``(PIL image or uint8 array, label)`` sources with
a transform applied on access; the validation split is cut from ``train`` by :func:`stratified_split`, as the
papers do (the official test split is only for the final number).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torch.utils.data import Dataset, Subset

__all__ = ["TransformedDataset", "load_cifar", "load_hf", "load_imagefolder", "stratified_split"]


class TransformedDataset(Dataset):
    """(image, label) pairs from ``get(i)``, with ``transform`` applied to the image."""

    def __init__(self, length: int, get: Callable[[int], tuple[Any, int]], classes: list[str],
                 transform: Callable | None = None, labels: Sequence[int] | None = None) -> None:
        self.length, self.get, self.classes, self.transform = length, get, classes, transform
        self.labels = labels

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image, label = self.get(index)
        if not isinstance(image, Image.Image):
            image = Image.fromarray(np.asarray(image))
        image = image.convert("RGB")
        return (self.transform(image) if self.transform else image), int(label)

    def with_transform(self, transform: Callable | None) -> TransformedDataset:
        return TransformedDataset(self.length, self.get, self.classes, transform, self.labels)


def stratified_split(labels: Sequence[int], val_fraction: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """Indices (train, val) with each class split in the same proportion (at least one val sample per class
    that has two or more samples)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    train, val = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_val = min(len(idx) - 1, max(1, round(len(idx) * val_fraction))) if len(idx) > 1 else 0
        val += idx[:n_val].tolist()
        train += idx[n_val:].tolist()
    return sorted(train), sorted(val)


def subset(ds: TransformedDataset, indices: list[int]) -> Subset:
    sub = Subset(ds, indices)
    sub.classes = ds.classes  # type: ignore[attr-defined]
    return sub


def load_imagefolder(root: str | Path) -> tuple[TransformedDataset, TransformedDataset | None, list[str]]:
    """``root/train/<class>/*`` (and optionally ``root/test|val/<class>/*``), or ``root/<class>/*``."""
    from torchvision.datasets import ImageFolder

    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist (expected root/<class>/<image> or "
                                "root/train/<class>/<image>)")
    train_dir = root / "train" if (root / "train").is_dir() else root
    test_dir = next((root / d for d in ("test", "val") if (root / d).is_dir() and train_dir != root), None)

    def wrap(folder: Path) -> TransformedDataset:
        try:
            tv = ImageFolder(str(folder))
        except (FileNotFoundError, RuntimeError) as err:
            raise FileNotFoundError(f"no class folders with images under {folder}: {err}") from err
        return TransformedDataset(len(tv), lambda i: (tv.loader(tv.samples[i][0]), tv.samples[i][1]), tv.classes,
                                  labels=tv.targets)

    train = wrap(train_dir)
    test = wrap(test_dir) if test_dir else None
    if test is not None and test.classes != train.classes:
        raise ValueError(f"class folders differ between {train_dir} and {test_dir}")
    return train, test, train.classes


def load_hf(name: str, image_column: str = "image", label_column: str = "label", train_split: str = "train",
            test_split: str = "test", config: str | None = None
            ) -> tuple[TransformedDataset, TransformedDataset | None, list[str]]:
    """A Hugging Face dataset (hub name or local path) with an image and a label column."""
    import datasets

    data = datasets.load_dataset(name, config) if not Path(name).exists() else datasets.load_from_disk(name)
    if train_split not in data:
        raise ValueError(f"dataset {name!r} has no split {train_split!r}; splits: {list(data)}")
    columns = data[train_split].column_names
    for column, flag in ((image_column, "--image-column"), (label_column, "--label-column")):
        if column not in columns:
            raise ValueError(f"dataset {name!r} has no column {column!r} (pass {flag}); columns: {columns}")
    feature = data[train_split].features[label_column]
    classes = list(feature.names) if hasattr(feature, "names") else \
        [str(c) for c in sorted(set(data[train_split][label_column]))]

    def wrap(split: str) -> TransformedDataset:
        ds = data[split]
        return TransformedDataset(len(ds), lambda i: (ds[i][image_column], ds[i][label_column]), classes,
                                  labels=ds[label_column])

    return wrap(train_split), (wrap(test_split) if test_split in data else None), classes


def load_cifar(root: str | Path) -> tuple[TransformedDataset, TransformedDataset, list[str]]:
    """The CIFAR-10 / CIFAR-100 python pickles (``data_batch_*`` + ``test_batch``, or ``train`` + ``test``)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"CIFAR folder {root} does not exist (expected the python pickles, e.g. "
                                "cifar-10-batches-py/)")
    if (root / "data_batch_1").exists():
        train_files, test_files, meta, label_key, names_key = (
            sorted(root.glob("data_batch_*")), [root / "test_batch"], root / "batches.meta", b"labels",
            b"label_names")
    elif (root / "train").exists():
        train_files, test_files, meta, label_key, names_key = (
            [root / "train"], [root / "test"], root / "meta", b"fine_labels", b"fine_label_names")
    else:
        raise FileNotFoundError(f"{root} has neither data_batch_1 (CIFAR-10) nor train (CIFAR-100)")

    def read(files: list[Path]) -> tuple[np.ndarray, list[int]]:
        images, labels = [], []
        for f in files:
            try:
                with open(f, "rb") as fh:
                    batch = pickle.load(fh, encoding="bytes")
            except (OSError, pickle.UnpicklingError, EOFError) as err:
                raise ValueError(f"cannot read CIFAR pickle {f}: {err}") from err
            images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labels += list(batch[label_key])
        return np.concatenate(images), labels

    with open(meta, "rb") as fh:
        classes = [n.decode() for n in pickle.load(fh, encoding="bytes")[names_key]]
    (xtr, ytr), (xte, yte) = read(train_files), read(test_files)
    return (TransformedDataset(len(ytr), lambda i: (xtr[i], ytr[i]), classes, labels=ytr),
            TransformedDataset(len(yte), lambda i: (xte[i], yte[i]), classes, labels=yte), classes)
