"""The generated tasks behind one interface: what callers ask of ``arrows`` and ``motion`` instead of testing the
dataset's name.

A generated task draws its samples from a seed (nothing to download, validation and test from fixed seeds of their
own). Each names its setting (``ArrowConfig`` / ``MotionConfig``, held in ``TrainConfig.arrow`` / ``.motion``), its
dataset, the closed-form statistics it is normalised with, whether it is video, and how an evaluation sweeps it
(arrow grids; motion clips as ``FRAMESxGRID``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .arrows import ArrowConfig, ArrowDataset, arrow_statistics
from .video import MotionConfig, MotionDataset, motion_statistics

__all__ = ["GENERATED_TASKS", "GeneratedTask", "generated_task"]


@dataclasses.dataclass(frozen=True)
class GeneratedTask:
    name: str
    config_class: type
    dataset_class: type
    statistics: Callable[[Any], tuple[float, float]]  # (mean, std) of a setting's pixels
    is_video: bool
    setting_field: str  # the TrainConfig field holding the setting's fields ("arrow" / "motion")
    unit: str  # what one evaluation size is, for tables and plots

    def setting(self, fields: dict[str, Any] | None = None, **changes: Any) -> Any:
        """The task's setting from recorded fields (every field the config class knows; an option left out here
        would silently test on another task), with ``changes``."""
        known = {f.name for f in dataclasses.fields(self.config_class)}
        return self.config_class(**{**{k: v for k, v in (fields or {}).items() if k in known}, **changes})

    def dataset(self, size: int, setting: Any, seed: int, normalize: Any, channels: int) -> Any:
        return self.dataset_class(size, setting, seed=seed, normalize=normalize, channels=channels)

    def size_of(self, setting: Any) -> int | str:
        """A setting's evaluation size: the arrow grid, or the motion clip as ``FRAMESxGRID``."""
        return f"{setting.frames}x{setting.grid}" if self.is_video else setting.grid

    def sweep(self, base: Any, sizes: list[Any] | None) -> list[Any]:
        """The settings an evaluation scores: ``base`` at each size (arrow grids; motion ``(frames, grid)``
        pairs), or ``base`` alone."""
        if not sizes:
            return [base]
        if self.is_video:
            return [dataclasses.replace(base, frames=frames, grid=grid) for frames, grid in sizes]
        return [dataclasses.replace(base, grid=grid) for grid in sizes]


GENERATED_TASKS = {
    "arrows": GeneratedTask("arrows", ArrowConfig, ArrowDataset, arrow_statistics, is_video=False,
                            setting_field="arrow", unit="arrow grid (cells per side)"),
    "motion": GeneratedTask("motion", MotionConfig, MotionDataset, motion_statistics, is_video=True,
                            setting_field="motion", unit="clip (frames x cells per side)"),
}


def generated_task(spec: str) -> GeneratedTask | None:
    """The generated task a dataset spec names, or None (a dataset read from files)."""
    return GENERATED_TASKS.get(spec)
