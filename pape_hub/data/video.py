"""Video data: the built-in motion task, generated from a seed, and a folder of video files.

**The motion task** (``motion``): which way does the square go? A clip of ``frames`` grey frames on a
``grid x grid`` board of ``cell``-pixel cells holds a white square that moves one cell per time step (every
``tubelet_frames`` frames) in a straight line - up, right, down or left, the label - and ``distractors`` identical
squares that stand still (none by default: with two, a width-96 ViViT stays at chance for 12k clips). Within a
time step the frames are identical, so no single tubelet token shows motion: the answer needs the relation
between tokens at different (t, y, x), i.e. positions in space and time. Without position information a clip is a
bag of identical square tokens (chance, 25%); directions are drawn uniformly.

* Sample ``i`` with seed ``s`` depends only on (s, i); training, validation and test use disjoint seeds, and a
  longer or larger test clip reuses the generator with other ``frames`` / ``grid``.
* Pixels are normalised with the task's own statistics (:func:`motion_statistics`), like the arrow task.

**A folder of videos** (``videofolder:PATH``): ``PATH/<class>/<clip>`` (or ``PATH/train/...`` plus
``PATH/test/...``), any container and codec FFmpeg reads, decoded with PyAV; ``num_frames`` frames are sampled
evenly over each clip and resized to the model's size (transforms from ``torchvision.transforms.v2`` act on the
whole clip, so a random crop or flip is the same for every frame).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..settings import setting
from .arrows import DIRECTIONS, STEPS
from .generated import GeneratedDataset, pixel_statistics
from .images import TransformedDataset, class_folder_splits, scan_class_folders

__all__ = ["MotionConfig", "MotionDataset", "VIDEO_SUFFIXES", "VideoTransform", "load_videofolder",
           "motion_statistics", "read_video"]

VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".ogv", ".gif")


@dataclass(frozen=True)
class MotionConfig:
    """The motion task's setting; each field is also a ``pape-hub train --motion-*`` flag."""

    frames: int = setting(6, "motion task: frames per clip")
    grid: int = setting(5, "motion task: cells per side")
    cell: int = setting(8, "motion task: cell size in pixels")
    distractors: int = setting(0, "motion task: squares that stand still")
    tubelet_frames: int = setting(2, "motion task: frames per time step (the model's tubelet length)")

    def __post_init__(self) -> None:
        if self.frames % self.tubelet_frames:
            raise ValueError(f"frames ({self.frames}) must be a multiple of tubelet_frames ({self.tubelet_frames})")
        if self.steps < 2:
            raise ValueError(f"the clip needs at least 2 time steps to show motion, got {self.steps}")
        if self.grid < self.steps:
            raise ValueError(f"a square moving one cell per step for {self.steps} steps needs a grid of at least "
                             f"{self.steps} cells, got {self.grid}")
        if self.cell < 4:
            raise ValueError(f"cells must be at least 4 px, got {self.cell}")
        if self.distractors < 0 or self.distractors > self.grid * self.grid - self.steps:
            raise ValueError(f"{self.distractors} distractors do not fit beside the moving square's path")

    @property
    def steps(self) -> int:
        """Time steps (tubelets along time) in a clip."""
        return self.frames // self.tubelet_frames

    @property
    def image_size(self) -> int:
        return self.grid * self.cell


@functools.lru_cache(maxsize=8)
def _square(cell: int) -> np.ndarray:
    margin = max(1, cell // 4)
    square = np.zeros((cell, cell), dtype=np.uint8)
    square[margin:cell - margin, margin:cell - margin] = 255
    return square


class MotionDataset(GeneratedDataset):
    """``length`` deterministic clips: (video float tensor (C, T, H, W), label int); see the module docstring;
    normalisation and channels as :class:`~pape_hub.data.generated.GeneratedDataset`."""

    name, config_class, pixel_dims, label_names = "motion", MotionConfig, 3, DIRECTIONS
    statistics_seed, statistics_samples = 7_100_003, 512

    def sample(self, index: int) -> tuple[np.ndarray, int, dict[str, Any]]:
        """(uint8 clip (T, S, S), label, layout: the mover's cells per step and the distractors' cells)."""
        if not 0 <= index < self.length:
            raise IndexError(index)
        cfg, rng = self.config, np.random.default_rng([self.seed, index])
        g, steps = cfg.grid, cfg.steps
        direction = int(rng.integers(4))
        dr, dc = STEPS[direction]  # one cell per time step
        span = steps - 1
        rows = range(max(0, -dr * span), g - max(0, dr * span))  # starts whose whole path stays on the board
        cols = range(max(0, -dc * span), g - max(0, dc * span))
        start = (int(rng.choice(rows)), int(rng.choice(cols)))
        path = [(start[0] + dr * s, start[1] + dc * s) for s in range(steps)]
        free = [(r, c) for r in range(g) for c in range(g) if (r, c) not in path]
        still = [free[i] for i in rng.permutation(len(free))[: cfg.distractors]]
        square, cell = _square(cfg.cell), cfg.cell
        board = np.zeros((steps, cfg.image_size, cfg.image_size), dtype=np.uint8)
        for s in range(steps):
            for r, c in [path[s], *still]:
                board[s, r * cell:(r + 1) * cell, c * cell:(c + 1) * cell] = square
        clip = np.repeat(board, cfg.tubelet_frames, axis=0)  # static within a tubelet
        return clip, direction, dict(path=path, distractors=still)

def motion_statistics(config: MotionConfig) -> tuple[float, float]:
    """(mean, std) of the pixels (in [0, 1]) of 512 clips of ``config`` from a fixed seed."""
    return pixel_statistics(MotionDataset, config)


def check_frame_size(stream: Any, path: str | Path) -> None:
    """Refuse a video whose frames are larger than Pillow's pixel limit (``PIL.Image.MAX_IMAGE_PIXELS``, what every
    image obeys here), before any frame is decoded: a small file can hold one huge frame, which stacked for a clip
    would ask for gigabytes."""
    from PIL import Image

    width, height = stream.codec_context.width or 0, stream.codec_context.height or 0
    limit = Image.MAX_IMAGE_PIXELS
    if limit and width * height > limit:
        raise ValueError(f"video {path} has {width}x{height} frames ({width * height:,} pixels), over the limit of "
                         f"{limit:,} pixels a frame (Pillow's MAX_IMAGE_PIXELS, as for images); downscale the video, "
                         "or raise PIL.Image.MAX_IMAGE_PIXELS if it is trusted")


def read_video(path: str | Path, num_frames: int) -> np.ndarray:
    """``num_frames`` RGB frames (T, H, W, 3) uint8 sampled evenly over a video file (repeating frames of a
    shorter clip). Frames are decoded as a stream and only the sampled ones are kept, so memory is that of the clip,
    whatever the file's length (a second pass counts the frames where the container does not say)."""
    import av

    try:
        with av.open(str(path)) as container:
            check_frame_size(container.streams.video[0], path)
            total = container.streams.video[0].frames or sum(1 for _ in container.decode(video=0))
        if total == 0:
            raise ValueError(f"video {path} has no frames")
        wanted = np.linspace(0, total - 1, num_frames).round().astype(int).tolist()
        keep, kept = set(wanted), {}
        with av.open(str(path)) as container:
            for index, frame in enumerate(container.decode(video=0)):
                if index in keep:
                    kept[index] = frame.to_ndarray(format="rgb24")
                if index >= wanted[-1]:
                    break
    except (av.error.FFmpegError, OSError, IndexError) as err:  # IndexError: no video stream
        raise ValueError(f"cannot decode video {path}: {err}") from err
    if not kept:
        raise ValueError(f"video {path} has no frames")
    last = kept[max(kept)]  # a container that claims more frames than it holds: its last decoded frame repeats
    return np.stack([kept.get(i, last) for i in wanted])


class VideoTransform:
    """Clip (T, H, W, C) uint8 -> (C, T, size, size) float, normalised. Training: a random resized crop with
    ``crop_scale`` and a horizontal flip with probability ``hflip``, the same for every frame of the clip."""

    def __init__(self, size: int, mean: Any, std: Any, crop_scale: tuple[float, float] | None = None,
                 hflip: float = 0.0) -> None:
        from torchvision.transforms import v2

        resize = v2.RandomResizedCrop(size, scale=crop_scale, antialias=True) if crop_scale else \
            v2.Resize((size, size), antialias=True)
        steps = [resize] + ([v2.RandomHorizontalFlip(hflip)] if hflip else [])
        self.transform = v2.Compose([*steps, v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])

    def __call__(self, clip: np.ndarray) -> torch.Tensor:
        from torchvision import tv_tensors

        video = tv_tensors.Video(torch.from_numpy(np.ascontiguousarray(clip)).permute(0, 3, 1, 2))  # (T, C, H, W)
        return self.transform(video).as_subclass(torch.Tensor).transpose(0, 1).contiguous()  # (C, T, H, W)


class VideoFolderDataset(TransformedDataset):
    """(clip, label) pairs of a folder; the clip is decoded on access, frames converted to ``channels``."""

    def __init__(self, files: list[Path], labels: list[int], classes: list[str], num_frames: int,
                 transform: Callable | None = None, channels: int = 3) -> None:
        super().__init__(len(files), self._read, classes, transform, labels, channels,
                         source=lambda i: str(files[i]))
        self.files, self.num_frames = files, num_frames

    def _read(self, index: int) -> tuple[np.ndarray, int]:
        return read_video(self.files[index], self.num_frames), self.labels[index]

    def __getitem__(self, index: int) -> tuple[Any, int]:
        clip, label = self.read(index)
        if self.channels == 1:
            clip = clip.mean(-1, keepdims=True).round().astype(np.uint8)
        return (self.transform(clip) if self.transform else clip), int(label)

    def check(self, index: int, full: bool = True) -> None:
        """Decode the clip (``full``), or open its container and find a video stream."""
        if full:
            self.read(index)
            return
        import av

        try:
            with av.open(str(self.files[index])) as container:
                check_frame_size(container.streams.video[0], self.files[index])
        except (av.error.FFmpegError, OSError, IndexError) as err:
            raise ValueError(f"cannot decode video {self.files[index]}: {err}") from err

    def with_transform(self, transform: Callable | None, channels: int | None = None) -> VideoFolderDataset:
        return VideoFolderDataset(self.files, self.labels, self.classes, self.num_frames, transform,
                                  self.channels if channels is None else channels)


def load_videofolder(root: str | Path, num_frames: int
                     ) -> tuple[VideoFolderDataset, VideoFolderDataset | None, VideoFolderDataset | None, list[str]]:
    """(train, validation or None, test or None, classes) of ``root/<class>/<clip>`` (or ``root/train/<class>/...``
    and optionally ``root/validation|val/...`` and ``root/test/...``); links to folders are followed once (see
    :func:`~pape_hub.data.images.walk_files`)."""
    splits = class_folder_splits(root, "video folder", "clip.mp4")
    seen: tuple[set[Path], dict[Path, Path]] = (set(), {})  # one clip is in one split only

    def scan(folder: Path | None, classes: list[str] | None = None) -> VideoFolderDataset | None:
        if folder is None:
            return None
        files, labels, classes = scan_class_folders(folder, VIDEO_SUFFIXES, "video", classes, seen)
        return VideoFolderDataset(files, labels, classes, num_frames)

    train = scan(splits.train)
    return train, scan(splits.validation, train.classes), scan(splits.test, train.classes), train.classes
