"""The LieRE spatial-reasoning task ("which way does the arrow the Y points at point?"), generated from a seed.

A ``grid x grid`` image of ``cell``-pixel cells (``grid x columns`` when ``columns`` is set; a ``shapes`` mix
draws each sample's grid from a list, for native-resolution training), white glyphs on black. One ``Y`` sits in a
random cell with its base (stem) pointing up, right, down or left; the *target* arrow sits in the neighbouring cell
on the stem's side, and the label is the target arrow's direction (0 up, 1 right, 2 down, 3 left). Distractors:
more arrows and upright letters A-E in other cells. LieRE section 5.2 does not say "neighbouring cell"; that is the
reading taken here.

* Arrow directions are balanced in every image (``num_arrows`` is a multiple of 4, each direction equally often,
  target included), so counting arrows tells nothing and chance is exactly 25%.
* ``hard_negatives`` distractor arrows go into the Y's *other* neighbour cells, so "the arrow next to the Y" is
  ambiguous unless the Y's orientation is read. ``isolated=True`` is the opposite control: no distractor arrow
  is ever next to the Y, so the answer is "the arrow adjacent to the Y" and direction is not needed; an encoding
  without directionality (ALiBi, PaPE-RI) can solve this variant but not the default one, where another arrow
  is often adjacent too.
* Glyphs are drawn once with PIL lines at 4x and downsampled; an image is a few numpy copies of templates.
* Sample ``i`` of a dataset with seed ``s`` depends only on (s, i): train, validation and test sets are disjoint
  seeds, and a larger-grid test set reuses the same generator with another ``grid``.

* Pixels are normalised with the task's own mean and std (:func:`arrow_statistics`, about 0.044 / 0.171 for the
  default setting: background -0.26, glyph +5.6), like any dataset normalised with its own statistics. An earlier
  version mapped pixels to [-1, 1] (background at -1); with that input the rotary encodings sat at chance for the
  whole default budget while they solve the task with the dataset's statistics.

The defaults (grid 4, cell 12, 4 arrows, no letters, no hard negatives) are the setting in which a tiny ViT
separates the encodings in minutes on 2 CPU cores; ``paper_setting()`` is the LieRE paper's (9x9 grid of 12 px
cells, 8 arrows, 6 letters including the Y).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from ..settings import setting
from .generated import GeneratedDataset, pixel_statistics

__all__ = ["ArrowConfig", "ArrowDataset", "DIRECTIONS", "STEPS", "arrow_statistics", "paper_setting", "parse_grid",
           "render_glyphs"]

DIRECTIONS = ("up", "right", "down", "left")  # the labels of the arrow and motion tasks
STEPS = {0: (-1, 0), 1: (0, 1), 2: (1, 0), 3: (0, -1)}  # (row, col) offset of each direction
_LETTERS = "ABCDE"
_SUPERSAMPLE = 4


@dataclass(frozen=True)
class ArrowConfig:
    """The arrow task's setting; each field is also a ``pape-hub train --arrow-*`` flag."""

    grid: int = setting(4, "arrow task: cells per side")
    cell: int = setting(12, "arrow task: cell size in pixels")
    num_arrows: int = setting(4, "arrow task: arrows per image", flag="arrows")
    num_letters: int = setting(0, "arrow task: distractor letters", flag="letters")
    hard_negatives: int = setting(0, "arrow task: distractor arrows next to the Y")
    isolated: bool = setting(False, "arrow task control: no distractor arrow next to the Y (direction not needed)")
    columns: int = setting(0, "arrow task: cells per row (0: as many as --arrow-grid, square images)")
    shapes: str = setting("", "arrow task: a mix of grid shapes ROWSxCOLUMNS, comma-separated (e.g. 3x6,4x4,6x3): each "
                          "sample draws one and keeps its own size and aspect ratio (train with --native-resolution)",
                          metavar="RxC,...")

    def __post_init__(self) -> None:
        if self.isolated and self.hard_negatives:
            raise ValueError("isolated (no distractor arrow next to the Y) contradicts hard_negatives > 0")
        if self.grid < 2:
            raise ValueError(f"arrow task grid must be at least 2, got {self.grid}")
        if self.num_arrows < 4 or self.num_arrows % 4:
            raise ValueError(f"num_arrows must be a positive multiple of 4 (balanced directions), "
                             f"got {self.num_arrows}")
        if self.hard_negatives > min(3, self.num_arrows - 1):
            raise ValueError(f"hard_negatives must be at most {min(3, self.num_arrows - 1)}, got {self.hard_negatives}")
        if self.columns < 0 or self.columns == 1:
            raise ValueError(f"arrow task columns must be 0 (square) or at least 2, got {self.columns}")
        cells_needed = 1 + self.num_arrows + self.num_letters
        for rows, cols in self.grid_shapes:
            if min(rows, cols) < 2:
                raise ValueError(f"arrow task shape {rows}x{cols}: a grid needs at least 2 cells per side")
            if cells_needed > rows * cols:
                raise ValueError(f"{cells_needed} glyphs do not fit in a {rows}x{cols} grid")
        if self.cell < 8:
            raise ValueError(f"cells must be at least 8 px to draw glyphs, got {self.cell}")

    @property
    def image_size(self) -> int:
        """The side of the model's native (square) input: ``grid`` cells, whatever ``columns`` or ``shapes`` say."""
        return self.grid * self.cell

    @property
    def grid_shapes(self) -> list[tuple[int, int]]:
        """The (rows, columns) of the grids samples are drawn at: the ``shapes`` mix, else one grid."""
        if not self.shapes:
            return [(self.grid, self.columns or self.grid)]
        return [parse_grid(shape.strip()) for shape in self.shapes.split(",")]

    @property
    def image_shapes(self) -> list[tuple[int, int]]:
        """The (height, width) in pixels of the images samples are drawn at, one per grid shape."""
        return [(rows * self.cell, cols * self.cell) for rows, cols in self.grid_shapes]

    @property
    def varying_shape(self) -> bool:
        """Samples of different sizes (a ``shapes`` mix): batched only as native-resolution token sequences."""
        return len(set(self.grid_shapes)) > 1


def parse_grid(size: int | str | tuple[int, int]) -> tuple[int, int]:
    """An arrow grid as (rows, columns) from ``6``, ``"6"``, ``"4x8"`` or ``(4, 8)``."""
    if isinstance(size, tuple):
        return size
    rows, _, cols = str(size).lower().partition("x")
    try:
        return int(rows), int(cols or rows)
    except ValueError:
        raise ValueError(f"an arrow grid is a number of cells per side or ROWSxCOLUMNS (e.g. 6 or 4x8), got "
                         f"{size!r}") from None


def paper_setting(grid: int = 9) -> ArrowConfig:
    """LieRE's setting: 108 px image, 9x9 cells, 8 arrows (one target), Y plus 5 other letters (A-E)."""
    return ArrowConfig(grid=grid, cell=12, num_arrows=8, num_letters=5, hard_negatives=1)


def _draw(cell: int, strokes: list[tuple[float, float, float, float]]) -> np.ndarray:
    big = cell * _SUPERSAMPLE
    img = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(img)
    for x0, y0, x1, y1 in strokes:  # coordinates in [0, 1] of the cell
        draw.line([(x0 * big, y0 * big), (x1 * big, y1 * big)], fill=255, width=max(2, big // 9))
    return np.asarray(img.resize((cell, cell), Image.Resampling.BOX), dtype=np.uint8)


def _rotate(template: np.ndarray, quarter_turns_clockwise: int) -> np.ndarray:
    return np.rot90(template, k=-quarter_turns_clockwise).copy()


@functools.lru_cache(maxsize=16)
def render_glyphs(cell: int) -> dict[str, np.ndarray]:
    """Templates (cell x cell uint8): ``arrow{d}``, ``y{d}`` (stem pointing d), and the letters."""
    arrow_up = _draw(cell, [(0.5, 0.85, 0.5, 0.15), (0.5, 0.15, 0.25, 0.45), (0.5, 0.15, 0.75, 0.45)])
    y_stem_down = _draw(cell, [(0.5, 0.5, 0.5, 0.88), (0.5, 0.5, 0.2, 0.12), (0.5, 0.5, 0.8, 0.12)])
    letters = {
        "A": [(0.2, 0.88, 0.5, 0.12), (0.5, 0.12, 0.8, 0.88), (0.32, 0.58, 0.68, 0.58)],
        "B": [(0.25, 0.12, 0.25, 0.88), (0.25, 0.12, 0.65, 0.2), (0.65, 0.2, 0.65, 0.42), (0.65, 0.42, 0.25, 0.5),
              (0.25, 0.5, 0.72, 0.6), (0.72, 0.6, 0.72, 0.8), (0.72, 0.8, 0.25, 0.88)],
        "C": [(0.78, 0.15, 0.25, 0.15), (0.25, 0.15, 0.25, 0.85), (0.25, 0.85, 0.78, 0.85)],
        "D": [(0.25, 0.12, 0.25, 0.88), (0.25, 0.12, 0.75, 0.35), (0.75, 0.35, 0.75, 0.65), (0.75, 0.65, 0.25, 0.88)],
        "E": [(0.72, 0.12, 0.25, 0.12), (0.25, 0.12, 0.25, 0.88), (0.25, 0.88, 0.72, 0.88), (0.25, 0.5, 0.62, 0.5)],
    }
    glyphs = {f"arrow{d}": _rotate(arrow_up, d) for d in range(4)}
    glyphs.update({f"y{d}": _rotate(y_stem_down, (d - 2) % 4) for d in range(4)})  # stem down = direction 2
    glyphs.update({name: _draw(cell, strokes) for name, strokes in letters.items()})
    return glyphs


def arrow_statistics(config: ArrowConfig) -> tuple[float, float]:
    """(mean, std) of the pixels (scaled to [0, 1]) of 2,048 images of ``config`` from a fixed seed: the
    normalisation a model trained on this setting uses, whatever its training seed."""
    return pixel_statistics(ArrowDataset, config)


class ArrowDataset(GeneratedDataset):
    """``length`` deterministic samples: (image float tensor (C, H, W), label int); normalisation and channels as
    :class:`~pape_hub.data.generated.GeneratedDataset`."""

    name, config_class, pixel_dims, label_names = "arrows", ArrowConfig, 2, DIRECTIONS
    statistics_seed, statistics_samples = 7_000_003, 2048

    def __init__(self, length: int, config: ArrowConfig | None = None, seed: int = 0,
                 normalize: str | tuple[Any, Any] | None = "auto", channels: int = 3) -> None:
        super().__init__(length, config, seed, normalize, channels)
        self.glyphs = render_glyphs(self.config.cell)

    def sample(self, index: int) -> tuple[np.ndarray, int, dict]:
        """(uint8 image (rows x cell, columns x cell), label, layout) where layout says what went where (for tests
        and plots)."""
        if not 0 <= index < self.length:
            raise IndexError(index)
        cfg, rng = self.config, np.random.default_rng([self.seed, index])
        shapes = cfg.grid_shapes  # a mix draws first; one shape draws nothing, so square grids are as ever
        rows, cols = shapes[int(rng.integers(len(shapes)))] if len(shapes) > 1 else shapes[0]
        while True:  # a Y whose stem side stays inside the grid
            y_row, y_col, stem = int(rng.integers(rows)), int(rng.integers(cols)), int(rng.integers(4))
            t_row, t_col = y_row + STEPS[stem][0], y_col + STEPS[stem][1]
            if 0 <= t_row < rows and 0 <= t_col < cols:
                break
        directions = rng.permutation(np.repeat(np.arange(4), cfg.num_arrows // 4))
        label = int(directions[0])
        layout = {(y_row, y_col): f"y{stem}", (t_row, t_col): f"arrow{label}"}
        neighbours = [(y_row + dr, y_col + dc) for dr, dc in STEPS.values()]
        neighbours = [(r, c) for r, c in neighbours if 0 <= r < rows and 0 <= c < cols and (r, c) not in layout]
        hard = [neighbours[i] for i in rng.permutation(len(neighbours))[: cfg.hard_negatives]]
        free = [(r, c) for r in range(rows) for c in range(cols) if (r, c) not in layout and (r, c) not in hard]
        free = [free[i] for i in rng.permutation(len(free))]
        if cfg.isolated:  # distractor arrows only away from the Y; its free neighbour cells may take letters
            away = [cell for cell in free if cell not in neighbours]
            arrow_cells = away[: cfg.num_arrows - 1]
            free = [cell for cell in free if cell not in arrow_cells]
        else:
            arrow_cells = hard + free[: cfg.num_arrows - 1 - len(hard)]
            free = free[cfg.num_arrows - 1 - len(hard):]
        for cell, direction in zip(arrow_cells, directions[1:]):
            layout[cell] = f"arrow{int(direction)}"
        for cell in free[: cfg.num_letters]:
            layout[cell] = _LETTERS[int(rng.integers(len(_LETTERS)))]
        image = np.zeros((rows * cfg.cell, cols * cfg.cell), dtype=np.uint8)
        for (r, c), glyph in layout.items():
            image[r * cfg.cell:(r + 1) * cfg.cell, c * cfg.cell:(c + 1) * cfg.cell] = self.glyphs[glyph]
        return image, label, layout

