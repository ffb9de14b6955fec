"""Real image datasets: an ImageFolder tree, a Hugging Face ``datasets`` name, the CIFAR python pickles and
scikit-learn's bundled ``digits``.

Every loader returns ``(train, test, classes)`` as lists of ``(PIL image or uint8 array, label)`` sources with
a transform applied on access; the validation split is cut from ``train`` by :func:`stratified_split`, as the
papers do (the official test split is only for the final number). Labels are always ``0 .. len(classes) - 1``:
loaders whose raw labels are strings or do not start at 0 map them (the class names keep the raw values).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torch.utils.data import Dataset, Subset

__all__ = [
    "TransformedDataset", "channel_statistics", "load_cifar", "load_digits", "load_hf", "load_imagefolder",
    "stratified_split",
]

IMAGE_MODES = {1: "L", 3: "RGB"}


class TransformedDataset(Dataset):
    """(image, label) pairs from ``get(i)``: the image converted to ``channels`` (1 = grey, 3 = RGB), then
    ``transform`` applied."""

    def __init__(self, length: int, get: Callable[[int], tuple[Any, int]], classes: list[str],
                 transform: Callable | None = None, labels: Sequence[int] | None = None, channels: int = 3) -> None:
        if channels not in IMAGE_MODES:
            raise ValueError(f"images can be read with 1 (grey) or 3 (RGB) channels, not {channels}")
        self.length, self.get, self.classes, self.transform = length, get, classes, transform
        self.labels, self.channels = labels, channels

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image, label = self.get(index)
        if not isinstance(image, Image.Image):
            image = Image.fromarray(np.asarray(image))
        image = to_8bit(image).convert(IMAGE_MODES[self.channels])
        return (self.transform(image) if self.transform else image), int(label)

    def with_transform(self, transform: Callable | None, channels: int | None = None) -> TransformedDataset:
        return TransformedDataset(self.length, self.get, self.classes, transform, self.labels,
                                  self.channels if channels is None else channels)


#: Pillow's modes of more than 8 bits per sample, with the largest value each can hold
WIDE_MODES = {"I;16": 65535, "I;16L": 65535, "I;16B": 65535, "I;16N": 65535, "I": 65535}


def to_8bit(image: Image.Image) -> Image.Image:
    """16-bit (and 32-bit integer) grey images scaled to 8 bits. Pillow's ``convert("L")`` / ``"RGB"`` clips them
    instead (a 16-bit PNG becomes almost all white). 32-bit "I" images are read as 16-bit data, what PNG and TIFF
    loaders give for 16-bit files; 8-bit and float images are left to ``convert``."""
    top = WIDE_MODES.get(image.mode)
    if top is None:
        return image
    values = np.asarray(image, dtype=np.float64)
    return Image.fromarray(np.clip(np.rint(values * (255.0 / top)), 0, 255).astype(np.uint8), mode="L")


def open_image(path: str) -> Image.Image:
    """An image file in its own mode (torchvision's loader converts to RGB first, which clips 16-bit images)."""
    with open(path, "rb") as fh:
        image = Image.open(fh)
        image.load()
    return image


def channel_statistics(dataset: Dataset, max_samples: int = 2048, seed: int = 0) -> tuple[list[float], list[float]]:
    """Per-channel mean and std over up to ``max_samples`` images of ``dataset`` (tensors (C, H, W), as its
    transform gives them: scaled to [0, 1], not yet normalised), drawn with a fixed seed."""

    n = len(dataset)
    if n == 0:
        raise ValueError("cannot compute normalisation statistics of an empty dataset")
    order = np.random.default_rng(seed).permutation(n)[:max_samples]
    total = total_sq = count = 0
    for i in order:
        x = dataset[int(i)][0].double().flatten(1)  # (C, H*W)
        total = total + x.sum(1)
        total_sq = total_sq + (x * x).sum(1)
        count += x.shape[1]
    mean = total / count
    std = (total_sq / count - mean**2).clamp(min=0).sqrt().clamp(min=1e-3)
    return [round(float(v), 6) for v in mean], [round(float(v), 6) for v in std]


def index_labels(raw: Sequence[Any]) -> tuple[list[int], list[str]]:
    """Raw labels (strings, or integers not starting at 0) -> (indices 0..K-1, class names sorted)."""
    values = sorted(set(raw), key=lambda v: (isinstance(v, str), v))
    index = {v: i for i, v in enumerate(values)}
    return [index[v] for v in raw], [str(v) for v in values]


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


def class_folder_splits(root: str | Path, what: str, item: str) -> tuple[Path, Path | None]:
    """(training folder, test folder or None) of a dataset of class folders: ``root/<class>/*``, or
    ``root/train/<class>/*`` with optionally ``root/test`` (or ``root/val``) beside it."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{what} {root} does not exist (expected root/<class>/<{item}> or "
                                f"root/train/<class>/<{item}>)")
    train_dir = root / "train" if (root / "train").is_dir() else root
    test_dir = next((root / d for d in ("test", "val") if (root / d).is_dir() and train_dir != root), None)
    return train_dir, test_dir


def load_imagefolder(root: str | Path) -> tuple[TransformedDataset, TransformedDataset | None, list[str]]:
    """``root/train/<class>/*`` (and optionally ``root/test|val/<class>/*``), or ``root/<class>/*``."""
    from torchvision.datasets import ImageFolder

    train_dir, test_dir = class_folder_splits(root, "image folder", "image")

    def wrap(folder: Path) -> TransformedDataset:
        try:
            tv = ImageFolder(str(folder), loader=open_image)
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
    if hasattr(feature, "names"):  # a ClassLabel column: already 0 .. K-1 with names
        classes = list(feature.names)
        to_index = None
    else:  # strings or arbitrary integers: one mapping for every split, built from all of them
        everything = [v for split in data.values() for v in split[label_column]]
        _, classes = index_labels(everything)
        position = {name: i for i, name in enumerate(classes)}
        to_index = lambda v: position[str(v)]  # noqa: E731

    def wrap(split: str) -> TransformedDataset:
        ds = data[split]
        raw = ds[label_column]
        labels = list(raw) if to_index is None else [to_index(v) for v in raw]
        return TransformedDataset(len(ds), lambda i: (ds[i][image_column], labels[i]), classes, labels=labels)

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


def load_digits(test_fraction: float = 1 / 3) -> tuple[TransformedDataset, TransformedDataset, list[str]]:
    """scikit-learn's bundled handwritten digits (1,797 grey 8x8 images, 10 classes; no download).

    The images' 17 grey levels (0-16) are scaled to 0-255. scikit-learn ships no split, so a fixed stratified
    third (seed 0) is the test split."""
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)  # (N, 8, 8)
    labels = [int(v) for v in bunch.target]
    train_idx, test_idx = stratified_split(labels, test_fraction, seed=0)
    classes = [str(c) for c in bunch.target_names]

    def wrap(indices: list[int]) -> TransformedDataset:
        return TransformedDataset(len(indices), lambda i: (images[indices[i]], labels[indices[i]]), classes,
                                  labels=[labels[i] for i in indices], channels=1)

    return wrap(train_idx), wrap(test_idx), classes
