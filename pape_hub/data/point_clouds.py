"""Point clouds: a generated task of 3-D shapes, and readers of ModelNet40's files.

``shapes3d`` draws the surface of one of eight primitives with noise, a varying number of points and a random size,
centred and scaled to the unit sphere as ModelNet pipelines do. Training clouds are in their canonical pose;
``ShapeConfig.rotate`` gives every cloud a random 3-D rotation and ``translate`` a random shift (the test-time
settings where rotation invariance is what the task needs, and translation invariance is checked after centring).

ModelNet40 comes in two layouts, both read by :func:`load_modelnet`:

* meshes, ``root/<class>/{train,test}/<name>.off``: points are sampled on the faces, area-weighted, from a seed of
  the file's index (the same points every epoch);
* ``modelnet40_normal_resampled``: ``root/<class>/<name>.txt``, lines ``x,y,z,nx,ny,nz``, with
  ``root/modelnet40_train.txt`` / ``modelnet40_test.txt`` listing the names of each split.

Items are (points (n, 3 + C) float32, label); :func:`pad_collate` pads a batch and marks the padding.
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

__all__ = ["SHAPES", "PointFileDataset", "ShapeConfig", "ShapeDataset", "load_modelnet", "normalise_cloud",
           "pad_collate", "random_rotation", "read_off", "sample_mesh", "sample_shape"]

SHAPES = ("sphere", "cube", "cylinder", "cone", "torus", "pyramid", "octahedron", "capsule")


@dataclass(frozen=True)
class ShapeConfig:
    """The 3-D shapes task. ``points``: the most points of a cloud; ``min_points``: the fewest (each cloud draws its
    count between them); ``noise``: Gaussian jitter, in units of the unit sphere; ``rotate``: a random 3-D rotation
    per cloud; ``translate``: a random shift of up to this length after centring."""

    points: int = setting(512, "3-D shapes task: the most points of a cloud")
    min_points: int = setting(256, "3-D shapes task: the fewest points of a cloud")
    noise: float = setting(0.01, "3-D shapes task: Gaussian jitter of each point (unit-sphere units)")
    rotate: bool = setting(False, "3-D shapes task: every cloud in a random 3-D pose")
    translate: float = setting(0.0, "3-D shapes task: a random shift of up to this length")

    def __post_init__(self) -> None:
        if not 1 <= self.min_points <= self.points:
            raise ValueError(f"need 1 <= min_points <= points, got {self.min_points} and {self.points}")
        if not (math.isfinite(self.noise) and self.noise >= 0 and math.isfinite(self.translate)
                and self.translate >= 0):
            raise ValueError(f"noise and translate must be finite and >= 0, got {self.noise} and {self.translate}")


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    """A uniformly random 3-D rotation (QR of a Gaussian matrix, signs fixed, determinant +1)."""
    q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def _on_square_faces(n: int, rng: np.random.Generator) -> np.ndarray:
    """Points on the surface of the cube [-1, 1]^3."""
    p = rng.uniform(-1, 1, (n, 3))
    axis, side = rng.integers(0, 3, n), rng.choice([-1.0, 1.0], n)
    p[np.arange(n), axis] = side
    return p


def sample_shape(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 3) points on the surface of primitive ``kind`` in its canonical pose (its axis along z)."""
    u, v = rng.uniform(0, 1, n), rng.uniform(0, 1, n)
    phi = 2 * np.pi * u
    if kind == "sphere":
        z = 2 * v - 1
        return np.stack([np.sqrt(1 - z**2) * np.cos(phi), np.sqrt(1 - z**2) * np.sin(phi), z], -1)
    if kind == "cube":
        return _on_square_faces(n, rng)
    if kind == "cylinder":  # radius 0.6, height 2, with caps
        cap = rng.uniform(0, 1, n) < 0.15
        r = np.where(cap, 0.6 * np.sqrt(v), 0.6)
        z = np.where(cap, rng.choice([-1.0, 1.0], n), 2 * v - 1)
        return np.stack([r * np.cos(phi), r * np.sin(phi), z], -1)
    if kind == "cone":  # apex up, base radius 1 at z = -1
        base = rng.uniform(0, 1, n) < 0.3
        h = np.sqrt(v)  # area grows with the distance from the apex
        r = np.where(base, np.sqrt(v), h)
        z = np.where(base, -1.0, 1 - 2 * h)
        return np.stack([r * np.cos(phi), r * np.sin(phi), z], -1)
    if kind == "torus":  # radii 0.7 and 0.3, in the xy plane
        theta = 2 * np.pi * v
        ring = 0.7 + 0.3 * np.cos(theta)
        return np.stack([ring * np.cos(phi), ring * np.sin(phi), 0.3 * np.sin(theta)], -1)
    if kind == "pyramid":  # square base at z = -1, apex at (0, 0, 1)
        base = rng.uniform(0, 1, n) < 0.2
        h = np.sqrt(rng.uniform(0, 1, n))
        edge = _on_square_faces(n, rng)[:, :2]  # a point on the square's boundary...
        edge = edge / np.abs(edge).max(-1, keepdims=True)
        side = np.concatenate([edge * h[:, None], (1 - 2 * h)[:, None]], -1)
        flat = np.concatenate([rng.uniform(-1, 1, (n, 2)), -np.ones((n, 1))], -1)
        return np.where(base[:, None], flat, side)
    if kind == "octahedron":  # |x| + |y| + |z| = 1
        p = np.abs(rng.standard_normal((n, 3)))
        p = p / p.sum(-1, keepdims=True)
        return p * rng.choice([-1.0, 1.0], (n, 3))
    if kind == "capsule":  # a cylinder of radius 0.4 with hemispherical ends, along z
        z = rng.uniform(-1, 1, n)
        d = rng.standard_normal((n, 3))
        d = d / np.linalg.norm(d, axis=-1, keepdims=True) * 0.4
        straight = np.abs(z) < 0.6
        ring = np.stack([0.4 * np.cos(phi), 0.4 * np.sin(phi), z], -1)
        ends = d + np.stack([np.zeros(n), np.zeros(n), np.sign(z) * 0.6], -1)
        return np.where(straight[:, None], ring, ends)
    raise ValueError(f"unknown shape {kind!r}; shapes: {', '.join(SHAPES)}")


def normalise_cloud(points: np.ndarray) -> np.ndarray:
    """Centre the xyz columns on their mean and scale them into the unit sphere (ModelNet's convention)."""
    xyz = points[:, :3] - points[:, :3].mean(0)
    radius = np.linalg.norm(xyz, axis=-1).max()
    return np.concatenate([xyz / (radius if radius > 0 else 1.0), points[:, 3:]], axis=-1)


class ShapeDataset(Dataset):
    """``length`` clouds of :class:`ShapeConfig`, each drawn from ``np.random.default_rng([seed, index])``: (points
    (n, 3) float32, label), labels in :data:`SHAPES` order."""

    name = "shapes3d"

    def __init__(self, length: int, config: ShapeConfig | None = None, seed: int = 0) -> None:
        self.length, self.config, self.seed = length, config or ShapeConfig(), seed
        self.classes = list(SHAPES)

    def __len__(self) -> int:
        return self.length

    def sample(self, index: int) -> tuple[np.ndarray, int]:
        cfg, rng = self.config, np.random.default_rng([self.seed, index])
        label = int(rng.integers(len(SHAPES)))
        n = int(rng.integers(cfg.min_points, cfg.points + 1))
        points = sample_shape(SHAPES[label], n, rng) * rng.uniform(0.7, 1.3, 3)  # a random size per axis
        points = normalise_cloud(points + rng.normal(0, cfg.noise, points.shape))
        if cfg.rotate:
            points = points @ random_rotation(rng).T
        if cfg.translate:
            direction = rng.standard_normal(3)
            points = points + direction / np.linalg.norm(direction) * rng.uniform(0, cfg.translate)
        return points, label

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        points, label = self.sample(index)
        return torch.from_numpy(points).float(), label

    def describe(self) -> dict[str, Any]:
        return dict(name=self.name, length=self.length, seed=self.seed, **asdict(self.config))


def read_off(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """An ``.off`` mesh -> (vertices (V, 3), triangles (F, 3)); polygons are fanned into triangles. ModelNet's files
    sometimes join the header and the counts on one line (``OFF490 518 0``): both forms are read."""
    words = Path(path).read_text().split()
    if not words or not words[0].startswith("OFF"):
        raise ValueError(f"{path} is not an OFF mesh (its first word must be OFF)")
    head = [words[0][3:]] if len(words[0]) > 3 else []
    tokens = head + words[1:]
    try:
        nv, nf = int(tokens[0]), int(tokens[1])
        vertices = np.asarray(tokens[3 : 3 + 3 * nv], dtype=np.float64).reshape(nv, 3)
        rest, triangles = tokens[3 + 3 * nv :], []
        for _ in range(nf):
            k = int(rest[0])
            corners = [int(c) for c in rest[1 : 1 + k]]
            triangles += [(corners[0], corners[i], corners[i + 1]) for i in range(1, k - 1)]
            rest = rest[1 + k :]
    except (IndexError, ValueError) as err:
        raise ValueError(f"{path} is a truncated or malformed OFF mesh ({err})") from None
    faces = np.asarray(triangles, dtype=np.int64).reshape(-1, 3)
    if faces.size and (faces.min() < 0 or faces.max() >= nv):
        raise ValueError(f"{path} has faces pointing past its {nv} vertices")
    return vertices, faces


def sample_mesh(vertices: np.ndarray, faces: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 3) points uniformly on a triangle mesh's surface (faces drawn by area, then a uniform point in each)."""
    a, b, c = (vertices[faces[:, i]] for i in range(3))
    area = 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=-1)
    if not area.sum() > 0:
        raise ValueError("the mesh has no surface area to sample points from")
    face = rng.choice(len(faces), n, p=area / area.sum())
    r1, r2 = np.sqrt(rng.uniform(0, 1, n))[:, None], rng.uniform(0, 1, n)[:, None]
    return (1 - r1) * a[face] + r1 * (1 - r2) * b[face] + r1 * r2 * c[face]


class PointFileDataset(Dataset):
    """Point clouds read from files (``.off`` meshes or ``.txt`` samples), ``num_points`` each, normalised to the
    unit sphere; ``channels`` 3 (xyz) or 6 (xyz and the normals a ``.txt`` file holds)."""

    def __init__(self, files: list[Path], labels: list[int], classes: list[str], num_points: int = 1024,
                 channels: int = 3, seed: int = 0) -> None:
        if channels not in (3, 6):
            raise ValueError(f"point files give 3 (xyz) or 6 (xyz and normals) channels, got {channels}")
        self.files, self.labels, self.classes = files, labels, classes
        self.num_points, self.channels, self.seed = num_points, channels, seed

    def __len__(self) -> int:
        return len(self.files)

    def read(self, index: int) -> np.ndarray:
        path = self.files[index]
        if path.suffix == ".off":
            if self.channels != 3:
                raise ValueError(f"{path} is a mesh: it gives xyz only (channels=3)")
            vertices, faces = read_off(path)
            return sample_mesh(vertices, faces, self.num_points, np.random.default_rng([self.seed, index]))
        table = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2)
        if table.shape[1] < self.channels:
            raise ValueError(f"{path} has {table.shape[1]} values per line; {self.channels} channels need x,y,z"
                             + (",nx,ny,nz" if self.channels == 6 else ""))
        return table[: self.num_points, : self.channels]  # the resampled files list points in FPS order

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(normalise_cloud(self.read(index))).float(), self.labels[index]


def load_modelnet(root: str | Path, num_points: int = 1024, channels: int = 3
                  ) -> tuple[PointFileDataset, PointFileDataset]:
    """(train, test) of a ModelNet folder in either layout (see the module's docstring)."""
    root = Path(root)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise FileNotFoundError(f"{root} holds no class folders (ModelNet40: root/<class>/train/*.off, or "
                                "root/<class>/*.txt with root/modelnet40_train.txt)")
    splits: dict[str, tuple[list[Path], list[int]]] = {"train": ([], []), "test": ([], [])}
    lists = {s: next((p for p in [root / f"modelnet40_{s}.txt", *sorted(root.glob(f"*_{s}.txt"))] if p.is_file()),
                     None) for s in splits}  # the resampled layout's split lists, modelnet40's first
    for split, (files, labels) in splits.items():
        listing = lists[split]
        if listing is not None:  # the resampled layout: names like airplane_0001
            for name in listing.read_text().split():
                cls = name.rsplit("_", 1)[0]
                files.append(root / cls / f"{name}.txt")
                labels.append(classes.index(cls))
            continue
        for label, cls in enumerate(classes):  # the mesh layout
            for path in sorted((root / cls / split).glob("*.off")):
                files.append(path)
                labels.append(label)
        if not files:
            raise FileNotFoundError(f"no {split} clouds under {root}: expected {root}/<class>/{split}/*.off, or a "
                                    f"list modelnet40_{split}.txt of the names of .txt files")
    return tuple(PointFileDataset(files, labels, classes, num_points, channels)  # type: ignore[return-value]
                 for files, labels in splits.values())


def pad_collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Samples of different lengths (n_i, C) -> ({"x": (B, N, C) zero-padded, "valid": (B, N)}, labels (B,)): the
    input of a free-token model (``model(batch)`` or ``model(**batch)``)."""
    length = max(len(x) for x, _ in batch)
    x = torch.zeros(len(batch), length, batch[0][0].shape[-1])
    valid = torch.zeros(len(batch), length, dtype=torch.bool)
    for i, (sample, _) in enumerate(batch):
        x[i, : len(sample)], valid[i, : len(sample)] = sample, True
    return dict(x=x, valid=valid), torch.tensor([label for _, label in batch])
