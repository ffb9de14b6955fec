"""The generated tasks behind one interface: what callers ask of ``arrows`` and ``motion`` instead of testing the
dataset's name.

A generated task draws its samples from a seed (nothing to download, validation and test from fixed seeds of their
own). Each names its setting (``ArrowConfig`` / ``MotionConfig``, held in ``TrainConfig.arrow`` / ``.motion``), its
dataset, the statistics it is normalised with (measured on a fixed sample of the setting), whether it is video,
and how an evaluation sweeps it (arrow grids; motion clips as ``FRAMESxGRID``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .arrows import ArrowDataset, parse_grid
from .generated import GeneratedDataset, pixel_statistics
from .video import MotionDataset

__all__ = ["GENERATED_TASKS", "GeneratedTask", "generated_task"]


@dataclasses.dataclass(frozen=True)
class GeneratedTask:
    """A generated task: its dataset class (which names the task, its setting class and its pixels' dimensions)
    and what a training run and an evaluation need beyond it."""

    dataset_class: type[GeneratedDataset]
    setting_field: str  # the TrainConfig field holding the setting's fields ("arrow" / "motion")
    unit: str  # what one evaluation size is, for tables and plots

    @property
    def name(self) -> str:
        return self.dataset_class.name

    @property
    def config_class(self) -> type:
        return self.dataset_class.config_class

    @property
    def is_video(self) -> bool:
        return self.dataset_class.pixel_dims == 3  # clips (T, S, S)

    def statistics(self, setting: Any) -> tuple[float, float]:
        """(mean, std) of a setting's pixels, the normalisation a model trained on it uses."""
        return pixel_statistics(self.dataset_class, setting)

    def setting(self, fields: dict[str, Any] | None = None, **changes: Any) -> Any:
        """The task's setting from recorded fields (every field the config class knows; an option left out here
        would silently test on another task), with ``changes``."""
        known = {f.name for f in dataclasses.fields(self.config_class)}
        return self.config_class(**{**{k: v for k, v in (fields or {}).items() if k in known}, **changes})

    def dataset(self, size: int, setting: Any, seed: int, normalize: Any, channels: int) -> Any:
        return self.dataset_class(size, setting, seed=seed, normalize=normalize, channels=channels)

    def size_of(self, setting: Any) -> int | str:
        """A setting's evaluation size: the arrow grid (``ROWSxCOLUMNS`` where not square), or the motion clip as
        ``FRAMESxGRID``."""
        if self.is_video:
            return f"{setting.frames}x{setting.grid}"
        return setting.grid if setting.columns in (0, setting.grid) else f"{setting.grid}x{setting.columns}"

    def default_sizes(self, base: Any) -> list[Any]:
        """The sizes a task is compared at (``python -m lab arrows`` and ``compare``): the training size and two larger
        ones - arrow grids g, g + 2, g + 4; motion clips of 2 more cells per side and of 2 more time steps."""
        if self.is_video:
            return [(base.frames, base.grid), (base.frames, base.grid + 2),
                    (base.frames + 2 * base.tubelet_frames, base.grid)]
        return [base.grid, base.grid + 2, base.grid + 4]

    def sweep(self, base: Any, sizes: list[Any] | None) -> list[Any]:
        """The settings an evaluation scores: ``base`` at each size (arrow grids; motion ``(frames, grid)``
        pairs); by default at :meth:`default_sizes`."""
        sizes = sizes or self.default_sizes(base)
        if self.is_video:
            return [dataclasses.replace(base, frames=frames, grid=grid) for frames, grid in sizes]
        shapes = [parse_grid(size) for size in sizes]  # each size one grid: a training shape mix is not swept
        return [dataclasses.replace(base, grid=rows, columns=0 if cols == rows else cols, shapes="")
                for rows, cols in shapes]


GENERATED_TASKS = {task.name: task for task in (
    GeneratedTask(ArrowDataset, setting_field="arrow", unit="arrow grid (cells per side)"),
    GeneratedTask(MotionDataset, setting_field="motion", unit="clip (frames x cells per side)"),
)}


def generated_task(spec: str) -> GeneratedTask | None:
    """The generated task a dataset spec names, or None (a dataset read from files)."""
    return GENERATED_TASKS.get(spec)
