"""Event streams: a generated task whose class lies in the timing, and a reader of the common event file layouts.

``movingdot`` records a dot crossing a small sensor, the way N-MNIST was recorded: a pixel fires when the dot's
edge enters it and again when it leaves, at the time it does. The dot moves right, left, down or up (the classes).
Polarity is drawn at random (``EventConfig.polarity=False``, the default), so that a right- and a left-moving dot fire
the same pixels with the same polarities: only *when* each pixel fires tells them apart. ``speed`` changes how long
a crossing takes (the test sweep's durations), ``keep`` the share of events kept (its rates); ``noise`` adds events
at random pixels and times.

Files: ``.npy`` / ``.npz`` (a structured array, or arrays, with fields ``x, y, t, p``; or an (N, 4) array in that
column order) and ``.h5`` / ``.hdf5`` (datasets ``x, y, t, p``, at the top or under ``events/``), in class folders
as image folders are laid out (``root/<class>/*`` or ``root/train|validation|test/<class>/*``). Items are (events
(n, 4) float32 as (x, y, t, polarity +-1), label); :func:`~pape_hub.data.point_clouds.pad_collate` batches them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..settings import setting
from .images import class_folder_splits, scan_class_folders

__all__ = ["EVENT_SUFFIXES", "MOTIONS", "EventConfig", "EventFileDataset", "MovingDotDataset", "load_event_folder",
           "read_events"]

MOTIONS = ("right", "left", "down", "up")
EVENT_SUFFIXES = (".npy", ".npz", ".h5", ".hdf5")


@dataclass(frozen=True)
class EventConfig:
    """The moving-dot task: a ``sensor`` x ``sensor`` camera, a dot of ``radius`` pixels crossing it in
    ``duration / speed`` time stamps (in ``steps`` positions), a ``keep`` share of its events kept, ``noise`` random
    events per crossing, and polarity that carries the sign of the change (``polarity=True``) or none."""

    sensor: int = setting(32, "moving-dot task: sensor side in pixels")
    radius: float = setting(3.0, "moving-dot task: the dot's radius in pixels")
    duration: float = setting(100_000.0, "moving-dot task: time stamps a crossing takes at speed 1")
    speed: float = setting(1.0, "moving-dot task: crossings per duration")
    steps: int = setting(48, "moving-dot task: positions of the dot along its path")
    keep: float = setting(1.0, "moving-dot task: share of the dot's events kept")
    noise: int = setting(20, "moving-dot task: random events per stream")
    polarity: bool = setting(False, "moving-dot task: polarity gives the sign of the change (else random)")

    def __post_init__(self) -> None:
        for name in ("radius", "duration", "speed"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"EventConfig.{name} must be finite and positive, got {value}")
        if not 0 < self.keep <= 1 or self.steps < 2 or self.noise < 0 or self.sensor < 4:
            raise ValueError(f"need 0 < keep <= 1, steps >= 2, noise >= 0, sensor >= 4; got {self}")


class MovingDotDataset(Dataset):
    """``length`` streams of :class:`EventConfig`, each from ``np.random.default_rng([seed, index])``: (events (n, 4)
    float32 as (x, y, t, p), label), labels in :data:`MOTIONS` order."""

    name = "movingdot"

    def __init__(self, length: int, config: EventConfig | None = None, seed: int = 0) -> None:
        self.length, self.config, self.seed = length, config or EventConfig(), seed
        self.classes = list(MOTIONS)

    def __len__(self) -> int:
        return self.length

    def sample(self, index: int) -> tuple[np.ndarray, int]:
        cfg, rng = self.config, np.random.default_rng([self.seed, index])
        label = int(rng.integers(len(MOTIONS)))
        s, r = cfg.sensor, cfg.radius
        along = np.linspace(-r, s - 1 + r, cfg.steps)  # the dot's centre along its path, off-sensor to off-sensor
        across = rng.uniform(r, s - 1 - r)  # its path's place across
        if MOTIONS[label] in ("left", "up"):
            along = along[::-1]
        horizontal = MOTIONS[label] in ("right", "left")
        cx, cy = (along, np.full_like(along, across)) if horizontal else (np.full_like(along, across), along)
        pixels = np.arange(s)
        covered = ((pixels[None, None, :] - cx[:, None, None]) ** 2
                   + (pixels[None, :, None] - cy[:, None, None]) ** 2) <= r * r  # (steps, y, x)
        change = covered[1:] != covered[:-1]  # (steps - 1, y, x): a pixel entered or left
        step, y, x = np.nonzero(change)
        dt = cfg.duration / cfg.speed / (cfg.steps - 1)
        start = rng.uniform(0, cfg.duration)  # streams do not start at time 0
        t = start + (step + rng.uniform(0, 1, step.shape)) * dt
        p = np.where(covered[1:][step, y, x], 1.0, -1.0) if cfg.polarity else rng.choice([-1.0, 1.0], step.shape)
        events = np.stack([x, y, t, p], -1).astype(np.float64)
        events = events[rng.uniform(0, 1, len(events)) < cfg.keep]
        noise = np.stack([rng.integers(0, s, cfg.noise), rng.integers(0, s, cfg.noise),
                          start + rng.uniform(0, cfg.duration / cfg.speed, cfg.noise),
                          rng.choice([-1.0, 1.0], cfg.noise)], -1)
        return np.concatenate([events, noise]), label

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        events, label = self.sample(index)
        return torch.from_numpy(events).float(), label

    def describe(self) -> dict[str, Any]:
        return dict(name=self.name, length=self.length, seed=self.seed, **asdict(self.config))


def _columns(fields: Any, path: Path) -> np.ndarray:
    """(n, 4) float64 from a mapping-like ``fields`` with x, y, t, p; polarity 0/1 becomes -1/+1."""
    missing = [k for k in "xytp" if k not in fields]
    if missing:
        raise ValueError(f"{path} has no event field(s) {missing}; expected x, y, t, p")
    x, y, t, p = (np.asarray(fields[k], dtype=np.float64).reshape(-1) for k in "xytp")
    if not len(x) == len(y) == len(t) == len(p):
        raise ValueError(f"{path}: the fields x, y, t, p differ in length ({len(x)}, {len(y)}, {len(t)}, {len(p)})")
    return np.stack([x, y, t, np.where(p > 0, 1.0, -1.0)], -1)


def read_events(path: str | Path) -> np.ndarray:
    """One event file -> (n, 4) float64 as (x, y, t, polarity +-1); see the module's docstring for the layouts."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".h5", ".hdf5"):
        import h5py

        with h5py.File(path, "r") as f:
            group = f["events"] if "events" in f and isinstance(f["events"], h5py.Group) else f
            return _columns({k: group[k][()] for k in "xytp" if k in group}, path)
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            return _columns({k: data[k] for k in data.files}, path)
    array = np.load(path, allow_pickle=False)
    if array.dtype.names:
        return _columns({k: array[k] for k in array.dtype.names}, path)
    if array.ndim != 2 or array.shape[1] != 4:
        raise ValueError(f"{path} holds an array of shape {array.shape}; expected (N, 4) as x, y, t, p or a "
                         "structured array with fields x, y, t, p")
    return _columns({k: array[:, i] for i, k in enumerate("xytp")}, path)


class EventFileDataset(Dataset):
    """Event files of class folders: (events (n, 4) float32, label)."""

    def __init__(self, files: list[Path], labels: list[int], classes: list[str]) -> None:
        self.files, self.labels, self.classes = files, labels, classes

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(read_events(self.files[index])).float(), self.labels[index]


def load_event_folder(root: str | Path) -> tuple[EventFileDataset, EventFileDataset | None,
                                                 EventFileDataset | None]:
    """(train, validation or None, test or None) of event files in class folders."""
    splits = class_folder_splits(root, "event folder", "event file")
    seen: tuple[set[Path], dict[Path, Path]] = (set(), {})
    train_files, train_labels, classes = scan_class_folders(splits.train, EVENT_SUFFIXES, "event", None, seen)
    out = [EventFileDataset(train_files, train_labels, classes)]
    for folder in (splits.validation, splits.test):
        if folder is None:
            out.append(None)
            continue
        files, labels, _ = scan_class_folders(folder, EVENT_SUFFIXES, "event", classes, seen)
        out.append(EventFileDataset(files, labels, classes))
    return tuple(out)  # type: ignore[return-value]
