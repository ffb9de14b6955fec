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
from typing import Any, NamedTuple

import numpy as np
from PIL import Image, ImageOps
from torch.utils.data import Dataset, Subset

__all__ = [
    "FolderSplits", "LAYOUTS", "TransformedDataset", "channel_statistics", "check_readable", "class_folder_splits",
    "load_cifar", "load_digits", "load_hf",
    "load_imagefolder", "scan_class_folders", "stratified_split", "walk_files",
]

IMAGE_MODES = {1: "L", 3: "RGB"}


#: what a broken or hostile image file raises while it is read (PIL's SyntaxError: a malformed header)
UNREADABLE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError, EOFError)


class TransformedDataset(Dataset):
    """(image, label) pairs from ``get(i)``: the image converted to ``channels`` (1 = grey, 3 = RGB), then
    ``transform`` applied. ``source(i)`` names where sample ``i`` comes from (a file), for errors."""

    def __init__(self, length: int, get: Callable[[int], tuple[Any, int]], classes: list[str],
                 transform: Callable | None = None, labels: Sequence[int] | None = None, channels: int = 3,
                 source: Callable[[int], str] | None = None) -> None:
        if channels not in IMAGE_MODES:
            raise ValueError(f"images can be read with 1 (grey) or 3 (RGB) channels, not {channels}")
        self.length, self.get, self.classes, self.transform = length, get, classes, transform
        self.labels, self.channels, self.source = labels, channels, source

    def __len__(self) -> int:
        return self.length

    def read(self, index: int) -> tuple[Any, int]:
        """Sample ``index`` as stored (decoded, not transformed); one error naming its file if it cannot be read."""
        try:
            return self.get(index)
        except UNREADABLE as err:
            where = self.source(index) if self.source else f"sample {index}"
            raise ValueError(f"cannot read {where}: {err}") from err

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image, label = self.read(index)
        if not isinstance(image, Image.Image):
            image = Image.fromarray(np.asarray(image))
        image = to_8bit(image).convert(IMAGE_MODES[self.channels])
        return (self.transform(image) if self.transform else image), int(label)

    def with_transform(self, transform: Callable | None, channels: int | None = None) -> TransformedDataset:
        return TransformedDataset(self.length, self.get, self.classes, transform, self.labels,
                                  self.channels if channels is None else channels, self.source)

    def check(self, index: int, full: bool = True) -> None:
        """Raise, naming the file, if sample ``index`` cannot be read: decoded in full, or (``full=False``, for a
        large training split) only its file's header."""
        if full:
            self.read(index)
        elif self.source is not None:
            path = self.source(index)
            try:
                Image.open(path).close()
            except UNREADABLE as err:
                raise ValueError(f"cannot read image {path}: {type(err).__name__}: {err}") from err


def check_readable(dataset: Dataset, full: bool = True) -> None:
    """Check every sample of a split (:meth:`TransformedDataset.check`); generated datasets have no files."""
    base, indices = (dataset.dataset, dataset.indices) if isinstance(dataset, Subset) else (dataset, None)
    if not isinstance(base, TransformedDataset):
        return
    for index in indices if indices is not None else range(len(base)):
        base.check(int(index), full)


#: Pillow's modes of more than 8 bits per sample, with the largest value each can hold
WIDE_MODES = {"I;16": 65535, "I;16L": 65535, "I;16B": 65535, "I;16N": 65535, "I": 65535}


def to_8bit(image: Image.Image) -> Image.Image:
    """16-bit (and 32-bit integer) grey images scaled to 8 bits. Pillow's ``convert("L")`` / ``"RGB"`` clips them
    instead (a 16-bit PNG becomes almost all white). 32-bit "I" images are read as 16-bit data, what PNG and TIFF
    loaders give for 16-bit files. 32-bit float ("F") images hold intensities in [0, 1] (scaled by 255; Pillow would
    make them black) or, where they exceed 1, in 0-255 (clipped); 8-bit images are left to ``convert``."""
    if image.mode == "F":
        values = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0)
        scale = 255.0 if values.size and values.max() <= 1.0 else 1.0
        return Image.fromarray(np.clip(np.rint(values * scale), 0, 255).astype(np.uint8), mode="L")
    top = WIDE_MODES.get(image.mode)
    if top is None:
        return image
    values = np.asarray(image, dtype=np.float64)
    return Image.fromarray(np.clip(np.rint(values * (255.0 / top)), 0, 255).astype(np.uint8), mode="L")


def open_image(path: str | Path) -> Image.Image:
    """An image file in its own mode (torchvision's loader converts to RGB first, which clips 16-bit images), turned
    upright by its EXIF orientation; a truncated file, a decompression bomb or a file that is no image raises one
    error naming the file."""
    try:
        with open(path, "rb") as fh:
            image = Image.open(fh)
            image.load()
            # the camera's orientation, as transformers' pipeline (and every viewer) applies it
            image = ImageOps.exif_transpose(image)
    except UNREADABLE as err:
        raise ValueError(f"cannot read image {path}: {type(err).__name__}: {err}") from err
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


#: the folder names of the held-out splits beside ``train/``: validation (timm's ``--val-split``, ``datasets``'
#: imagefolder) and test
VALIDATION_FOLDERS, TEST_FOLDERS = ("validation", "val"), ("test",)
#: marks of pape_hub's own output folders: a class folder holding one is a run or checkpoint, not images of a class
OUTPUT_MARKS = (".pape_hub_run.json", ".pape_hub_checkpoint.json", ".pape_hub.lock")
LAYOUTS = ("root/<class>/<file> (validation cut from it), or root/train/<class>/<file> with optionally "
           "root/validation/<class>/ (or val/) and root/test/<class>/ beside it")


class FolderSplits(NamedTuple):
    """The split folders of a dataset of class folders: training, and the held-out validation and test folders
    (None: not there)."""

    train: Path
    validation: Path | None
    test: Path | None


def class_folder_splits(root: str | Path, what: str, item: str) -> FolderSplits:
    """The split folders of a dataset of class folders: ``root/<class>/*``, or ``root/train/<class>/*`` with
    optionally ``root/validation`` (or ``root/val``) and ``root/test`` beside it."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{what} {root} does not exist (expected {LAYOUTS.replace('<file>', f'<{item}>')})")
    if not (root / "train").is_dir():
        return FolderSplits(root, None, None)
    held_out = [root / d for d in VALIDATION_FOLDERS if (root / d).is_dir()]
    if len(held_out) > 1:
        raise ValueError(f"{root} has both validation/ and val/; keep one validation folder (the other's images would "
                         "be silently ignored)")
    test = root / TEST_FOLDERS[0]
    return FolderSplits(root / "train", held_out[0] if held_out else None, test if test.is_dir() else None)


def walk_files(folder: Path, suffixes: tuple[str, ...], seen_dirs: set[Path], seen_files: dict[Path, Path]
               ) -> list[Path]:
    """Files with ``suffixes`` (any case) below ``folder``, following links to folders once: a folder reached a
    second time (a link cycle, or two links to one folder) and a file reached twice are refused by name, since each
    would repeat samples and could put one image in two splits. Sorted as torchvision's ImageFolder sorts them."""
    found, stack = [], [folder]
    while stack:
        current = stack.pop()
        real = current.resolve()
        if real in seen_dirs:
            raise ValueError(f"{current} leads to {real}, a folder already scanned (a link cycle or a second link to "
                             "it): each image must be reachable once; remove the link")
        seen_dirs.add(real)
        for entry in sorted(current.iterdir()):
            if entry.is_dir():
                stack.append(entry)
            elif entry.is_file() and entry.suffix.lower() in suffixes:
                target = entry.resolve()
                if target in seen_files:
                    raise ValueError(f"{entry} and {seen_files[target]} are the same file ({target}): an image "
                                     "counted twice, possibly in two splits or classes; remove one of them")
                seen_files[target] = entry
                found.append(entry)
    return sorted(found, key=lambda f: (str(f.parent), f.name))


def scan_class_folders(folder: Path, suffixes: tuple[str, ...], item: str, classes: list[str] | None = None,
                       seen: tuple[set[Path], dict[Path, Path]] | None = None) -> tuple[list[Path], list[int],
                                                                                        list[str]]:
    """(files, labels, classes) of ``folder/<class>/...``; ``classes``: the training split's, which a test split must
    have too; ``seen``: folders and files already scanned (the other split's), never scanned twice."""
    # hidden folders (.ipynb_checkpoints, .git) are no classes, as torchvision's ImageFolder skips them
    found = sorted(d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
    outputs = [name for name in found if any((folder / name / mark).exists() for mark in OUTPUT_MARKS)]
    if outputs:
        raise ValueError(f"{folder / outputs[0]} is a pape_hub output folder (a run or checkpoint), not a class of "
                         "images: move it out of the dataset, and write runs elsewhere (--output-dir)")
    classes = classes or found
    if not classes or found != classes:
        raise FileNotFoundError(f"{folder} must hold one folder per class ({classes or 'none found'}), got {found}; "
                                f"the layouts read: {LAYOUTS}")
    if len(classes) < 2:  # every prediction would be right: val 1.000 that means nothing
        raise ValueError(f"{folder} holds one class ({classes[0]}): a classifier tells classes apart, so it needs at "
                         f"least two; add a folder for each other class (the layouts read: {LAYOUTS})")
    seen_dirs, seen_files = seen if seen is not None else (set(), {})
    files, labels = [], []
    for label, name in enumerate(classes):
        members = walk_files(folder / name, suffixes, seen_dirs, seen_files)
        if not members:  # torchvision's ImageFolder refuses such a class too
            raise FileNotFoundError(f"class folder {folder / name} holds no {item} files ({', '.join(suffixes)}): "
                                    "add some, or remove the folder (an empty class can never be predicted)")
        files += members
        labels += [label] * len(members)
    return files, labels, classes


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # torchvision's


def load_imagefolder(root: str | Path) -> tuple[TransformedDataset, TransformedDataset | None,
                                               TransformedDataset | None, list[str]]:
    """(train, validation or None, test or None, classes) of ``root/<class>/*``, or ``root/train/<class>/*`` with
    optionally ``root/validation|val/<class>/*`` and ``root/test/<class>/*``."""
    splits = class_folder_splits(root, "image folder", "image")
    seen: tuple[set[Path], dict[Path, Path]] = (set(), {})  # one image is in one split only

    def wrap(folder: Path | None, classes: list[str] | None = None) -> TransformedDataset | None:
        if folder is None:
            return None
        files, labels, classes = scan_class_folders(folder, IMAGE_SUFFIXES, "image", classes, seen)
        return TransformedDataset(len(files), lambda i: (open_image(files[i]), labels[i]), classes, labels=labels,
                                  source=lambda i: str(files[i]))

    train = wrap(splits.train)
    return train, wrap(splits.validation, train.classes), wrap(splits.test, train.classes), train.classes


def load_hf(name: str, image_column: str = "image", label_column: str = "label", train_split: str = "train",
            test_split: str = "test", config: str | None = None, validation_split: str = "validation"
            ) -> tuple[TransformedDataset, TransformedDataset | None, TransformedDataset | None, list[str]]:
    """A Hugging Face dataset (hub name or local path) with an image and a label column: (train, validation or
    None, test or None, classes)."""
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

    return (wrap(train_split), wrap(validation_split) if validation_split in data else None,
            wrap(test_split) if test_split in data else None, classes)


class CifarUnpickler(pickle.Unpickler):
    """An unpickler that admits only what CIFAR's python batches hold: dicts, lists, bytes, str, ints and numpy
    arrays. Any other global (a ``__reduce__`` calling ``os.system``, say) is refused by name before it runs."""

    ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
               ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.numeric", "_frombuffer"),
               ("numpy._core.numeric", "_frombuffer"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a CIFAR batch never holds (only "
                                         "dicts, lists, bytes, strings, numbers and numpy arrays); not loaded")
        return super().find_class(module, name)


def read_cifar_pickle(path: Path) -> dict[bytes, Any]:
    """One CIFAR python pickle, read with :class:`CifarUnpickler`, checked to be a dict with bytes keys."""
    try:
        with open(path, "rb") as fh:
            batch = CifarUnpickler(fh, encoding="bytes").load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
        raise ValueError(f"cannot read CIFAR pickle {path}: {err}") from err
    if not isinstance(batch, dict):
        raise ValueError(f"CIFAR pickle {path} holds a {type(batch).__name__}, not the dict of a CIFAR batch")
    return batch


def _cifar_field(batch: dict[bytes, Any], key: bytes, path: Path) -> Any:
    if key not in batch:
        raise ValueError(f"CIFAR pickle {path} has no {key.decode()!r} entry (it has {sorted(batch)[:6]})")
    return batch[key]


def load_cifar(root: str | Path) -> tuple[TransformedDataset, TransformedDataset, list[str]]:
    """The CIFAR-10 / CIFAR-100 python pickles (``data_batch_*`` + ``test_batch``, or ``train`` + ``test``), read
    without running code from them (:class:`CifarUnpickler`)."""
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
            batch = read_cifar_pickle(f)
            data = np.asarray(_cifar_field(batch, b"data", f))
            if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
                raise ValueError(f"CIFAR pickle {f}: 'data' must be uint8 rows of 3072 values, got {data.dtype} "
                                 f"{data.shape}")
            images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labels += [int(v) for v in _cifar_field(batch, label_key, f)]
        return np.concatenate(images), labels

    classes = [n.decode() if isinstance(n, bytes) else str(n)
               for n in _cifar_field(read_cifar_pickle(meta), names_key, meta)]
    (xtr, ytr), (xte, yte) = read(train_files), read(test_files)
    for labels, name in ((ytr, "training"), (yte, "test")):
        if len(labels) and not 0 <= min(labels) <= max(labels) < len(classes):
            raise ValueError(f"CIFAR {name} labels lie outside 0..{len(classes) - 1} ({root})")
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
