"""What the generated tasks' datasets share: deterministic samples drawn from (seed, index), served as normalised
float tensors, and the statistics they are normalised with (measured once on a fixed sample of the setting)."""

from __future__ import annotations

import functools
from dataclasses import asdict
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["GeneratedDataset", "pixel_statistics"]


class GeneratedDataset(Dataset):
    """``length`` deterministic samples of ``config``: a subclass draws sample ``index`` in :meth:`sample` as (uint8
    pixels, label, layout) from ``np.random.default_rng([seed, index])``; items are (float tensor (C, *pixels'
    shape), label).

    ``normalize``: ``"auto"`` (default) uses :func:`pixel_statistics` of ``config``; a ``(mean, std)`` pair, each a
    number or one number per channel, uses those (a checkpoint's, when a model trained on one setting is evaluated
    on another); ``None`` gives [0, 1]. ``channels``: 3 (the grey pixels repeated, for RGB models) or 1.
    """

    name: ClassVar[str]  # as recorded in checkpoints
    config_class: ClassVar[type]
    pixel_dims: ClassVar[int]  # 2 for images (S, S), 3 for clips (T, S, S)
    label_names: ClassVar[tuple[str, ...]]  # the classes, in label order
    statistics_seed: ClassVar[int]
    statistics_samples: ClassVar[int]

    def __init__(self, length: int, config: Any = None, seed: int = 0,
                 normalize: str | tuple[Any, Any] | None = "auto", channels: int = 3) -> None:
        if channels not in (1, 3):
            raise ValueError(f"{self.name} samples have 1 or 3 channels, got {channels}")
        self.length, self.config, self.seed, self.channels = length, config or self.config_class(), seed, channels
        self.classes = list(self.label_names)
        if normalize == "auto":
            normalize = pixel_statistics(type(self), self.config)
        shape = (-1,) + (1,) * self.pixel_dims  # (C or 1, 1, ...) to broadcast over (C, *pixels)
        self.normalize = None if normalize is None else tuple(
            torch.tensor(v, dtype=torch.float32).reshape(shape) for v in normalize)

    def sample(self, index: int) -> tuple[np.ndarray, int, Any]:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        pixels, label, _ = self.sample(index)
        x = torch.from_numpy(pixels).float().div_(255.0)[None].expand(self.channels, *pixels.shape)  # (C, *pixels)
        if self.normalize is not None:
            mean, std = self.normalize
            x = (x - mean) / std
        return x.contiguous(), label

    def describe(self) -> dict[str, Any]:
        return dict(name=self.name, length=self.length, seed=self.seed, **asdict(self.config))


@functools.lru_cache(maxsize=32)
def pixel_statistics(dataset_class: type[GeneratedDataset], config: Any) -> tuple[float, float]:
    """(mean, std) of the pixels (scaled to [0, 1]) of the class's ``statistics_samples`` samples of ``config``
    from its fixed ``statistics_seed``: the normalisation a model trained on this setting uses, whatever its
    training seed."""
    raw = dataset_class(dataset_class.statistics_samples, config, seed=dataset_class.statistics_seed, normalize=None)
    pixels = np.concatenate([raw.sample(i)[0].ravel() for i in range(len(raw))]).astype(np.float64) / 255.0
    return float(pixels.mean()), float(pixels.std())
