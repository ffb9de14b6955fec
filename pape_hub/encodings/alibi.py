"""Distance-bias encodings: nD-ALiBi and LookHere.

Both add ``-slope * ||p_i - p_j||`` (Euclidean, patch units) to the attention logits. The bias does not
depend on content, so it is built once per grid and cached (one (heads, N, N) float32 tensor; LookHere
scales it per layer on the fly instead of caching depth copies). Prefix tokens get a zero row and column:
CLS attends to, and is attended by, every token without penalty.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .base import (
    BiasCoords,
    EncodingContext,
    PositionEncoding,
    TokenPositions,
    blockwise,
    compute_dtype,
    pad_prefix_bias,
)
from .registry import register_encoding

__all__ = ["ALiBi", "LookHere", "alibi_slopes", "assign_head_views", "head_slope", "split_heads"]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's geometric slopes: for n a power of two, start = 2^(-8/n), slope_i = start^(i+1).

    Other head counts take the slopes of the nearest lower power of two m, then every other slope of 2m.
    """

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if math.log2(num_heads).is_integer():
        return torch.tensor(power_of_two(num_heads))
    m = 2 ** math.floor(math.log2(num_heads))
    return torch.tensor(power_of_two(m) + power_of_two(2 * m)[0::2][: num_heads - m])


def pairwise_distance(coords: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
    """(..., N, p) -> (..., N, N) Euclidean distances in float32; with ``keys`` (..., M, p), (..., N, M)."""
    c = coords.to(compute_dtype(coords))
    other = c if keys is None else keys.to(c.dtype)
    return offset_length([c[..., :, None, axis] - other[..., None, :, axis] for axis in range(c.shape[-1])])


def offset_length(offsets: list[torch.Tensor], overwrite: bool = True) -> torch.Tensor:
    """The Euclidean length of per-axis offsets (each (..., N, M)): squared and summed an axis at a time, in the first
    offset's memory where ``overwrite`` (else in a new tensor; the others are only read). One (..., N, M, p) tensor of
    differences reduced by a norm over its last, tiny axis took 5x as long (ViT-S/16 at 896 px, a layer's 25 blocks
    of 128 rows: 56 ms against 10 ms, **ad hoc**); the square root of the exact sum of squares is also the correctly
    rounded distance."""
    first, *rest = offsets
    squared = first.mul_(first) if overwrite else first * first
    for offset in rest:
        squared.addcmul_(offset, offset)
    return squared.sqrt_()


def shared_bias_batch(state: Any, batch: int) -> int:
    """1 for a cached bias of one grid ((heads, T, T), shared by the batch), else ``batch`` (per-sample coordinates,
    (B, heads, T, T), or coordinates on the blockwise path)."""
    return 1 if isinstance(state, torch.Tensor) and state.ndim == 3 else batch


@register_encoding("alibi")
class ALiBi(PositionEncoding):
    """nD-ALiBi (CROMA's 2D-ALiBi): bias[h, i, j] = -slope_h * ||p_i - p_j||, ALiBi slopes per head.

    Translation and rotation invariant; no parameters. Other grids rebuild the bias (extrapolation).
    ``slope_scale`` multiplies every slope (1, the default, is the paper's geometric sequence). With few heads the
    sequence is shallow - 1/4 ... 1/256 for 4 heads, under one logit across a small grid - so locality is weak;
    scaling is the usual remedy (cf. ALiBi slope scaling for other lengths).
    """

    mechanisms = ("bias",)
    fused = False
    paper = "2D-ALiBi (Fuller et al. 2023)"

    def __init__(self, ctx: EncodingContext, slope_scale: float = 1.0) -> None:
        super().__init__(ctx)
        if not slope_scale > 0:
            raise ValueError(f"alibi slope_scale must be positive, got {slope_scale}")
        self.slope_scale = slope_scale
        self.register_buffer("slopes", torch.empty(ctx.num_heads))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.slopes.copy_(alibi_slopes(self.ctx.num_heads) * self.slope_scale)

    def bias(self, coords: torch.Tensor) -> torch.Tensor:
        """(N, p) -> (heads, N, N) for the patch tokens; (B, N, p) per sample -> (B, heads, N, N)."""
        dist = pairwise_distance(coords)[..., None, :, :]  # (..., 1, N, N)
        return -self.slopes.to(dist.dtype)[:, None, None] * dist

    def prepare(self, pos: TokenPositions) -> torch.Tensor | BiasCoords:
        """The whole bias, cached per grid; for long sequences the coordinates (:func:`blockwise`)."""
        if blockwise(pos.num_patches + pos.num_prefix_tokens):
            return BiasCoords.of(pos)
        return self.cached(pos.cache_key(), lambda: pad_prefix_bias(self.bias(pos.coords), pos.num_prefix_tokens))

    def bias_batch(self, state: Any, batch: int) -> int:
        """One grid's bias is shared by the batch: (heads, P+N, P+N)."""
        return shared_bias_batch(state, batch)

    def attn_bias(self, layer: int, q: torch.Tensor, k: torch.Tensor, state: Any) -> torch.Tensor:
        return self.rows(state, 0, state.coords.shape[-2]) if isinstance(state, BiasCoords) else state

    def attn_bias_rows(self, layer: int, q: torch.Tensor, k: torch.Tensor, state: Any
                       ) -> Callable[[int, int], torch.Tensor]:
        if isinstance(state, BiasCoords):
            return lambda start, stop: self.rows(state, start, stop)
        return lambda start, stop: state[..., start:stop, :]

    def rows(self, state: BiasCoords, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of the bias from the coordinates: (B', heads, rows, P+N)."""
        dist = state.zero_prefix(pairwise_distance(*state.rows(start, stop)), start)  # (B', rows, T)
        return -self.slopes.to(dist.dtype)[:, None, None] * dist[:, None]


# Each view says which keys a head may see, from the offset (dx, dy) = p_key - p_query, y growing down. As LookHere
# writes them: top_left sees dx <= 0 and dy <= 0 (top_right dx >= 0 and dy <= 0; the bottom ones dy >= 0 alike); up
# sees dy <= 0 and |dx| <= -dy (down dy >= 0 and |dx| <= dy; left and right with x and y swapped); up_half sees dy <= 0
# (the other halves alike); none sees every key. Inequalities are strict where LookHere's are, so every head always
# sees the query's own token.
# Direction groups named in a head_directions string; opposite directions first so that a group given
# only two heads still looks both ways.
_GROUPS = {
    "corners": ["top_left", "bottom_right", "top_right", "bottom_left"],
    "triangles": ["up", "down", "left", "right"],
    "halves": ["up_half", "down_half", "left_half", "right_half"],
    "none": ["none"],
}

# Each view's hidden keys, the complement of the view above, in the fewest passes over a block's (N, M) offsets
# (LookHere makes them for every block of rows in every layer on the blockwise path): a view is where two half-planes
# meet, so a key is hidden where either of two linear forms is positive. A float sum or difference is zero only where
# it is exactly, and keeps its sign, so these hide the same keys as the inequalities written out, boundaries included,
# for finite offsets (tests/test_encoding_properties.py checks them against those); a NaN offset hides nothing here, so
# that a NaN coordinate stays NaN in its bias. ``size`` holds |dx| ("x") and |dy| ("y") where a view needs them
# (:data:`_SIZES`), made once a block. ViT-S/16 896 px: the inequalities written out took 19 passes a block for the 6
# heads' four views, these 10 (a forward 5.04 s before, 4.61 s after, **ad hoc**).
_HIDDEN: dict[str, Callable[..., torch.Tensor]] = {
    "top_left": lambda dx, dy, size: torch.maximum(dx, dy) > 0,
    "bottom_right": lambda dx, dy, size: torch.minimum(dx, dy) < 0,
    "top_right": lambda dx, dy, size: (dy > 0).logical_or_(dx < 0),
    "bottom_left": lambda dx, dy, size: (dx > 0).logical_or_(dy < 0),
    "up": lambda dx, dy, size: (size["x"] + dy) > 0,  # dy > 0 or |dx| > -dy
    "down": lambda dx, dy, size: (size["x"] - dy) > 0,
    "left": lambda dx, dy, size: (size["y"] + dx) > 0,
    "right": lambda dx, dy, size: (size["y"] - dx) > 0,
    "up_half": lambda dx, dy, size: dy > 0,
    "down_half": lambda dx, dy, size: dy < 0,
    "left_half": lambda dx, dy, size: dx > 0,
    "right_half": lambda dx, dy, size: dx < 0,
}
#: the offset whose size a wedge's :data:`_HIDDEN` reads
_SIZES = {"up": "x", "down": "x", "left": "y", "right": "y"}


def split_heads(groups: list[str], num_heads: int) -> list[int]:
    """Heads per direction group. With at least 4 heads per group every group gets 4 and the first group takes
    the rest: 12 heads -> 4/4/4 (LH-90), 16 heads -> 8/4/4, the reference code's hard-coded splits. With fewer,
    heads are spread as evenly as possible, earlier groups first (6 heads -> 2/2/2)."""
    if num_heads >= 4 * len(groups):
        return [num_heads - 4 * (len(groups) - 1)] + [4] * (len(groups) - 1)
    return [num_heads // len(groups) + (i < num_heads % len(groups)) for i in range(len(groups))]


def assign_head_views(head_directions: str, num_heads: int) -> list[tuple[str, int]]:
    """One (view name, index within its group) per head from a LookHere ``head_directions`` string such as
    ``corners-triangles-none``; a group's heads take its directions in order, cycling."""
    groups = head_directions.split("-")
    unknown = [g for g in groups if g not in _GROUPS]
    if unknown:
        raise ValueError(f"unknown LookHere head direction group(s) {unknown}; valid: {sorted(_GROUPS)}")
    views = []
    for group, size in zip(groups, split_heads(groups, num_heads)):
        directions = _GROUPS[group]
        views += [(directions[i % len(directions)], i) for i in range(size)]
    return views


def head_slope(view: str, index_in_group: int) -> float:
    """The reference code's head slopes, counted within each direction group: directional heads
    2^-(1 + i // 4) (0.5 for a group's first 4 heads, 0.25 for the next 4, ...); ``none`` heads (plain 2D-ALiBi)
    1/4, 1/16, 1/64, ..."""
    if view == "none":
        return 4.0 ** -(index_in_group + 1)
    return 2.0 ** -(1 + index_in_group // 4)


@register_encoding("lookhere")
class LookHere(PositionEncoding):
    """LookHere (Fuller et al. 2024): 2D-ALiBi with per-head directional fields of view.

    bias[l, h, i, j] = -global_slope * layer_slope[l] * head_slope[h] * ||p_i - p_j|| inside the head's
    view, -inf outside. Defaults are LH-90 as copied by the PaPE code: global slope 2, layer slopes
    linspace(1.5, 0.5, depth), heads ``corners-triangles-none`` (see :func:`split_heads`). Head slopes follow
    the reference code, per direction group (:func:`head_slope`): at 12 heads the corner and triangle heads all
    get 0.5 and the ``none`` heads 1/4 ... 1/256. Distance is Euclidean. CLS row/column zero. Images only.

    ``bias_rounding="bfloat16"`` reproduces the reference code's numerics, which the released LookHere weights were
    trained with: each layer's bias is computed in float64 and rounded to bfloat16 (through float32, as torch
    converts), then used in the activations' dtype. Off by default: the rounding moves a bias by up to 2^-9 of its
    value.
    """

    mechanisms = ("bias",)
    fused = False
    supported_ndims = (2,)
    paper = "LookHere (Fuller et al. 2024), LH-90 defaults"

    def __init__(
        self,
        ctx: EncodingContext,
        head_directions: str = "corners-triangles-none",
        global_slope: float = 2.0,
        layer_slopes: tuple[float, float] = (1.5, 0.5),
        bias_rounding: str | None = None,
    ) -> None:
        super().__init__(ctx)
        if bias_rounding not in (None, "bfloat16"):
            raise ValueError(f"lookhere bias_rounding must be None or 'bfloat16', got {bias_rounding!r}")
        self.bias_rounding, self.head_directions = bias_rounding, head_directions
        self.heads = assign_head_views(head_directions, ctx.num_heads)
        self.views = [view for view, _ in self.heads]
        self.global_slope, self.layer_slope_range = global_slope, tuple(layer_slopes)
        self.register_buffer("head_slopes", torch.empty(ctx.num_heads))
        self.register_buffer("layer_slopes", torch.empty(ctx.depth))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.head_slopes.copy_(self.global_slope * torch.tensor([head_slope(v, i) for v, i in self.heads]))
        self.layer_slopes.copy_(torch.linspace(*self.layer_slope_range, self.ctx.depth))

    def base_bias(self, coords: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """(N, 2) -> (heads, N, N): -global * head slope * distance, -inf outside each head's view; (B, N, 2) per
        sample -> (B, heads, N, N); with ``keys`` (..., M, 2) the rows of ``coords`` as queries against those keys,
        (..., heads, N, M). The views read each pair's offset, so they follow the coordinates, not the token
        order."""
        c = coords.to(compute_dtype(coords))
        other = c if keys is None else keys.to(c.dtype)
        dx = other[..., None, :, 0] - c[..., :, None, 0]  # (..., N, M): key x - query x
        dy = other[..., None, :, 1] - c[..., :, None, 1]
        slopes = self.head_slopes.to(c.dtype) if not self.bias_rounding else torch.tensor(  # float64, unrounded
            [self.global_slope * head_slope(v, i) for v, i in self.heads], dtype=c.dtype, device=c.device)
        bias = -slopes[:, None, None] * offset_length([dx, dy], overwrite=False)[..., None, :, :]
        # each distinct view's hidden keys made once, each head's filled in place: a stack of every head's views and
        # its complement cost two (heads, N, M) passes more (ViT-S/16 896 px, a layer's blocks: 109 ms, **ad hoc**)
        hidden: dict[str, torch.Tensor] = {}
        axes = sorted({_SIZES[view] for view in self.views if view in _SIZES})
        sizes = {axis: (dx if axis == "x" else dy).abs() for axis in axes}  # |dx|, |dy|: once each, for the wedges
        for head, view in enumerate(self.views):
            if view != "none":  # sees every key
                if view not in hidden:
                    hidden[view] = _HIDDEN[view](dx, dy, sizes)
                bias[..., head, :, :].masked_fill_(hidden[view], float("-inf"))
        return bias

    def prepare(self, pos: TokenPositions) -> torch.Tensor | BiasCoords:
        """The layer-free bias, cached per grid; for long sequences the coordinates (:func:`blockwise`)."""
        if blockwise(pos.num_patches + pos.num_prefix_tokens):
            state = BiasCoords.of(pos)
            return state._replace(coords=state.coords.double()) if self.bias_rounding else state
        coords = pos.coords.double() if self.bias_rounding else pos.coords  # rounding: from float64, as the reference
        return self.cached(pos.cache_key(), lambda: pad_prefix_bias(self.base_bias(coords), pos.num_prefix_tokens))

    def bias_batch(self, state: Any, batch: int) -> int:
        """One grid's bias is shared by the batch: (heads, P+N, P+N), scaled per layer."""
        return shared_bias_batch(state, batch)

    def attn_bias_rows(self, layer: int, q: torch.Tensor, k: torch.Tensor, state: Any
                       ) -> Callable[[int, int], torch.Tensor]:
        if isinstance(state, BiasCoords):
            def rows(start: int, stop: int) -> torch.Tensor:
                base = state.zero_prefix(self.base_bias(*state.rows(start, stop)), start)  # prefix: no bias
                if self.bias_rounding:
                    return self.layer_bias(layer, base, q)
                return base.mul_(self.layer_slopes[layer])  # as layer_bias, in the block's own memory
            return rows
        return lambda start, stop: self.layer_bias(layer, state[..., start:stop, :], q)

    def attn_bias(self, layer: int, q: torch.Tensor, k: torch.Tensor, state: Any) -> torch.Tensor:
        """(heads, P+N, P+N), or (B, heads, P+N, P+N) per sample: this layer's slope times the grid's bias."""
        if isinstance(state, BiasCoords):
            return self.attn_bias_rows(layer, q, k, state)(0, state.coords.shape[-2])
        return self.layer_bias(layer, state, q)

    def layer_bias(self, layer: int, state: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The layer's slope times the layer-free bias (or a block of its rows)."""
        if not self.bias_rounding:
            return state * self.layer_slopes[layer]
        # the layer's bias in float64 (its slope as numpy's linspace computes it, not the float32 buffer), then
        # float64 -> float32 -> bfloat16 as torch converts, then the dtype attention runs in
        start, stop = self.layer_slope_range
        last = self.ctx.depth - 1
        slope = start + layer * ((stop - start) / last) if 0 < layer < last else (stop if layer else start)
        rounded = (state * slope).to(torch.float32).to(torch.bfloat16)
        return rounded.to(compute_dtype(q))
