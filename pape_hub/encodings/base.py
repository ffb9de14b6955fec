"""The one interface every position encoding implements.

Three mechanisms cover every method in this package, and an encoding may use more than one:

* ``tokens`` - a vector is added to the token embeddings once, before the first block
  (:meth:`PositionEncoding.add_to_tokens`);
* ``qk`` - queries and keys are transformed per layer before attention
  (:meth:`PositionEncoding.transform_qk`, both at once: one pass, fewer kernels), which keeps attention fused;
* ``bias`` - an additive logit bias is passed to attention as ``attn_mask``
  (:meth:`PositionEncoding.attn_bias`).

Positions
---------
Every encoding receives a :class:`TokenPositions`: the coordinates of the patch tokens in patch units,
axis order ``(x, y)`` for images (``x`` = column, grows to the right; ``y`` = row, grows downwards) and
``(x, y, t)`` for video, origin ``0`` at the first patch. Prefix tokens (CLS) come first in the sequence and have
no coordinates; each encoding documents what it does with them. Video time steps are ``temporal_scale`` patches long
(default 1). With position interpolation the coordinates are multiplied by ``train grid / test grid`` per axis (PaPE
appendix B); ``scale`` records the per-axis step (time unit x interpolation factor).

Two forms. A full grid shared by the batch (``coords`` (N, p), tokens in row-major order, the order of
``PatchEmbed``'s flatten; ``grid_size`` set): the fast path, cached across forwards. Or per token (``coords``
(B, N, p)): each sample's tokens at their own coordinates, in any order, with ``valid`` (B, N) marking padding
(timm's NaFlex batches, dropped tokens) and ``segments`` (B, N) the image each token belongs to in a packed row.
Every encoding follows each token's coordinates, never its index: a shuffled sample gives the same outputs, a
padded one its own, a packed row each image's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any, ClassVar, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "BLOCKWISE_FROM", "BLOCK_ROWS", "STATE_BYTES", "BiasCoords", "BiasRows", "BiasRowsByHand", "EncodingContext",
    "PositionEncoding", "TokenPositions", "autocast_dtype", "blockwise", "cell_counts", "cell_index", "compute_dtype",
    "differentiated", "full_precision", "grid_positions", "pad_prefix_bias", "row_blocks",
]


@dataclass(frozen=True)
class EncodingContext:
    """What an encoding needs to know about the model it sits in."""

    dim: int
    num_heads: int
    depth: int
    grid_size: tuple[int, ...]  # the training grid in patches, (H, W) or (T, H, W)
    num_prefix_tokens: int = 1

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def ndim(self) -> int:
        return len(self.grid_size)


@dataclass(frozen=True)
class TokenPositions:
    """Coordinates of the patch tokens: shared by the batch (a grid), or per sample (per token)."""

    coords: torch.Tensor  # (N, p) shared or (B, N, p) per sample; float, patch units, axis order (x, y[, t])
    num_prefix_tokens: int
    grid_size: tuple[int, ...] | None = None  # (H, W) / (T, H, W) of a shared grid; None otherwise
    scale: tuple[float, ...] | None = None  # per-axis grid step (unit x interpolation factor), coords' axis order
    valid: torch.Tensor | None = None  # (B, N) bool, False for padding (per-sample form only); None: all valid
    segments: torch.Tensor | None = None  # (B, N) int: which image of a packed row a token is; None: one image

    @property
    def ndim(self) -> int:
        return self.coords.shape[-1]

    @property
    def num_patches(self) -> int:
        return self.coords.shape[-2]

    @property
    def per_sample(self) -> bool:
        """True for per-token coordinates (B, N, p), False for a grid shared by the batch."""
        return self.coords.ndim == 3

    @property
    def axis_scale(self) -> torch.Tensor:
        """Interpolation factor per axis as a (p,) tensor (ones when interpolation is off)."""
        scale = self.scale or (1.0,) * self.ndim
        return torch.tensor(scale, dtype=self.coords.dtype, device=self.coords.device)

    def cache_key(self) -> tuple | None:
        """A hashable key for content-independent caches; None for per-token coordinates (they change with every
        batch)."""
        if self.grid_size is None or self.per_sample:
            return None
        return (self.grid_size, self.scale, self.num_prefix_tokens, self.coords.device, self.coords.dtype)

    def sample_coords(self) -> torch.Tensor:
        """(B', N, p) with B' = 1 for a shared grid: one form every encoding computes with (broadcast over B)."""
        return self.coords if self.per_sample else self.coords[None]

    def extent(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(lowest, highest) coordinate of each token's image, per axis, over its valid tokens: each (B', N, p) (a
        token's own sample, or in a packed row its own image). A padded token's coordinate counts for nothing."""
        coords = self.sample_coords()
        valid = self.valid if self.valid is not None else torch.ones(coords.shape[:2], dtype=torch.bool,
                                                                     device=coords.device)
        big = torch.finfo(coords.dtype).max
        if self.segments is None:
            hidden = (~valid)[..., None]
            low = coords.masked_fill(hidden, big).amin(-2, keepdim=True)
            high = coords.masked_fill(hidden, -big).amax(-2, keepdim=True)
            return low.expand_as(coords), high.expand_as(coords)
        images = int(self.segments.max()) + 1
        member = (self.segments[:, None, :] == torch.arange(images, device=coords.device)[None, :, None]) \
            & valid[:, None]  # (B, S, N)
        hidden = ~member[..., None]  # (B, S, N, 1)
        low = coords[:, None].masked_fill(hidden, big).amin(-2)  # (B, S, p)
        high = coords[:, None].masked_fill(hidden, -big).amax(-2)
        index = self.segments.clamp(min=0)[..., None].expand_as(coords)  # each token's image
        return low.gather(1, index), high.gather(1, index)

    def sample_grid_sizes(self) -> torch.Tensor:
        """(B', N, p) the grid of each token's image (its highest patch index + 1 per axis), in coordinate axis
        order (W, H[, T]), as timm's NaFlex computes each sample's grid from its coordinates."""
        _, high = self.extent()
        return (high / self.axis_scale).round().long() + 1

    def attention_mask(self) -> torch.Tensor | None:
        """Which keys each query may attend, as ``F.scaled_dot_product_attention`` takes a boolean mask: (B, 1, 1,
        P+N) keys only, for padding; (B, 1, P+N, P+N) block-diagonal for a packed row (an image's tokens see that
        image's only); None when every token sees every token. Prefix tokens are always valid. A padded query keeps
        attending to the valid keys, or in a packed row to itself, so that no row is empty (its output is dropped)."""
        if self.valid is None and self.segments is None:
            return None
        batch, prefix = self.coords.shape[0], self.num_prefix_tokens
        patches = self.valid if self.valid is not None else torch.ones(
            batch, self.num_patches, dtype=torch.bool, device=self.coords.device)
        valid = F.pad(patches, (prefix, 0), value=True)  # (B, P+N)
        if self.segments is None:
            return valid[:, None, None, :]
        segments = F.pad(self.segments, (prefix, 0), value=-1)  # (B, P+N)
        same = (segments[:, :, None] == segments[:, None, :]) & valid[:, None, :]  # (B, query, key)
        itself = torch.eye(segments.shape[1], dtype=torch.bool, device=segments.device)
        return (same | itself)[:, None]


def grid_positions(
    grid_size: tuple[int, ...],
    num_prefix_tokens: int,
    train_grid_size: tuple[int, ...] | None = None,
    interpolate: bool = False,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    axis_units: tuple[float, ...] | None = None,
) -> TokenPositions:
    """Positions of a full patch grid, optionally interpolated back to the training grid's range.

    ``axis_units`` (grid order, e.g. ``(temporal_scale, 1, 1)`` for video) is the length of one grid step on each
    axis in units of a spatial patch; it and the interpolation factor make up :attr:`TokenPositions.scale`.
    """
    # grid_size is (H, W) or (T, H, W); coordinate axes are reversed: (x, y) or (x, y, t)
    axes = [torch.arange(n, device=device, dtype=dtype) for n in grid_size]
    mesh = torch.meshgrid(*axes, indexing="ij")  # each (H, W) / (T, H, W), row-major like the patch flatten
    coords = torch.stack([m.reshape(-1) for m in reversed(mesh)], dim=-1)  # (N, p) = (x, y[, t])
    steps = [float(u) for u in reversed(axis_units)] if axis_units is not None else [1.0] * len(grid_size)
    if len(steps) != len(grid_size):
        raise ValueError(f"axis_units {axis_units} has {len(steps)} entries for a {len(grid_size)}-D grid")
    if interpolate and train_grid_size is not None and tuple(train_grid_size) != tuple(grid_size):
        steps = [s * float(t) / float(g) for s, t, g in zip(steps, reversed(train_grid_size), reversed(grid_size))]
    scale = None if all(s == 1.0 for s in steps) else tuple(steps)
    if scale is not None:
        coords = coords * torch.tensor(scale, device=device, dtype=dtype)
    return TokenPositions(coords, num_prefix_tokens, tuple(grid_size), scale)


def cell_index(whole: torch.Tensor, extent: tuple[int, ...]) -> torch.Tensor:
    """(..., p) whole patch coordinates -> (...) each one's cell in a grid of ``extent`` cells per axis (coordinate
    order: (x, y[, t])), the first axis fastest: a grid (H, W) / (T, H, W)'s row-major order, as the patch flatten and
    :func:`grid_positions` lay it out (cell x at sum_d x_d prod(extent[:d]))."""
    strides = torch.tensor([math.prod(extent[:d]) for d in range(len(extent))], device=whole.device)
    return (whole * strides).sum(-1)


def cell_counts(cell: torch.Tensor, cells: int) -> torch.Tensor:
    """(B, T) each token's cell of a grid of ``cells`` cells, or ``cells`` for a token on none (padding) -> (B, cells)
    how many of each sample's tokens lie on each cell."""
    counts = torch.zeros(cell.shape[0], cells + 1, dtype=torch.long, device=cell.device)
    return counts.scatter_add_(1, cell, torch.ones_like(cell))[:, :cells]


#: from this many tokens (prefix included) attention runs in blocks of query rows and a bias encoding forms its bias
#: one block at a time from coordinates (:meth:`PositionEncoding.attn_bias_rows`): no (heads, N, N) tensor is held.
#: Below it the whole bias is built once and cached across forwards (the fast path at training sizes).
BLOCKWISE_FROM = 1024
#: query rows per block of the blockwise path
BLOCK_ROWS = 128
#: per-forward state shared by every layer (rotary tables, PaPE's projected positions) is kept for all layers at once
#: only while it stays under this many bytes; above it each layer makes its own, which costs a few elementwise kernels
STATE_BYTES = 32 << 20


def row_blocks(num_rows: int, most: int | None = None, even: bool = False) -> list[tuple[int, int]]:
    """(start, stop) of each block of ``most`` rows (default :data:`BLOCK_ROWS`, query rows of attention), the last one
    shorter; ``even``: as few blocks, of one size but the last, shorter by less than a block's count."""
    most = BLOCK_ROWS if most is None else most
    size = math.ceil(num_rows / math.ceil(num_rows / most)) if even and num_rows else most
    return [(start, min(start + size, num_rows)) for start in range(0, num_rows, size)]


def differentiated(*tensors: torch.Tensor) -> bool:
    """Whether autograd records an operation on ``tensors``: gradients are on and one of them requires them."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def blockwise(num_tokens: int, batch_heads: int = 0) -> bool:
    """Whether attention over ``num_tokens`` (prefix included) takes the blockwise path: from :data:`BLOCKWISE_FROM`
    tokens, and in training wherever one layer's (``batch_heads``, T, T) bias would exceed :data:`STATE_BYTES`
    (autograd would keep one per layer, and a content-dependent bias several). ``batch_heads`` counts the bias's own
    leading size: the heads alone where the batch shares one bias (:meth:`PositionEncoding.bias_batch`). Never while
    torch.compile, torch.export or torch.fx trace (their graphs take the whole-bias path)."""
    if torch.compiler.is_compiling() or torch.fx._symbolic_trace.is_fx_symbolic_tracing():
        return False  # first: while tracing, the sizes are symbolic
    return num_tokens >= BLOCKWISE_FROM or (torch.is_grad_enabled() and 4 * batch_heads * num_tokens**2 > STATE_BYTES)


class BiasCoords(NamedTuple):
    """A bias encoding's per-forward state on the blockwise path: the coordinates instead of the bias. ``coords``
    (B', P+N, p) with the prefix rows zero; the first ``prefix`` tokens are prefix tokens (which get no bias)."""

    coords: torch.Tensor
    prefix: int

    @classmethod
    def of(cls, pos: TokenPositions) -> BiasCoords:
        return cls(F.pad(pos.sample_coords(), (0, 0, pos.num_prefix_tokens, 0)), pos.num_prefix_tokens)

    def rows(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(query coordinates (B', r, p), key coordinates (B', T, p))."""
        return self.coords[:, start:stop], self.coords

    def zero_prefix(self, block: torch.Tensor, start: int) -> torch.Tensor:
        """``block`` (..., r, T), rows ``start:`` of a bias, with its prefix rows and columns zero, in place (two
        slices, where a (r, T) mask of patch pairs cost a pass to make and one to apply)."""
        block[..., : max(0, self.prefix - start), :] = 0
        block[..., : self.prefix] = 0
        return block


class BiasRows(NamedTuple):
    """Rows of a bias made from tensors it is differentiable in: ``make(start, stop, *inputs)`` gives rows
    ``start:stop``. Blockwise attention in training on CPU keeps no block of the bias: its backward makes each block
    again from ``inputs`` and hands them their gradients. So an encoding whose bias rows need gradients (SaPE²'s,
    from its per-token vectors) names the tensors here, and ``make`` reads only those, not a closure's own copies; a
    bias free of gradients may be a plain function of (start, stop) (ALiBi's, LookHere's, from coordinates)."""

    make: Callable[..., torch.Tensor]
    inputs: tuple[torch.Tensor, ...] = ()
    #: optional, ``by_hand(*inputs)``: the same rows added into attention's logits, with their gradient by hand
    #: (:class:`BiasRowsByHand`), which blockwise attention in training on CPU takes instead of ``make`` and autograd
    by_hand: Callable[..., BiasRowsByHand] | None = None

    def __call__(self, start: int, stop: int) -> torch.Tensor:
        return self.make(start, stop, *self.inputs)


class BiasRowsByHand(Protocol):
    """What :class:`BiasRows`' ``by_hand(*inputs)`` gives: rows of the bias added straight into a block of logits, and
    the gradient of the inputs from the gradient of those logits, without autograd. An encoding gives one where its
    rows have a gradient cheaper by hand than through autograd (SaPE²'s distances: no temporary bias block, no
    autograd graph per block, the key side of the distances made once a layer)."""

    def add_rows(self, logits: torch.Tensor, start: int, stop: int) -> None:
        """Adds bias rows ``start:stop`` into ``logits`` (B, H, stop - start, T), in place."""

    def backward_rows(self, grad_logits: torch.Tensor, start: int, stop: int) -> None:
        """Adds to the inputs' gradients those of rows ``start:stop`` from the logits' gradient (B, H, rows, T);
        called right after :meth:`add_rows` of the same rows."""

    def grads(self) -> tuple[torch.Tensor | None, ...]:
        """The gradient of each input (None: none flowed), once every block's rows went back."""


def full_precision(device: torch.device) -> Any:
    """A context in which positional arithmetic is not autocast (a no-op on devices without autocast, e.g.
    ``meta``, where timm's tests run models)."""
    if device.type == "meta":
        return nullcontext()
    return torch.autocast(device.type, enabled=False)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast runs matmuls in on ``device``, or None when autocast is off there (or the device has
    none, e.g. ``meta``)."""
    if device.type == "meta" or not torch.is_autocast_enabled(device.type):
        return None
    return torch.get_autocast_dtype(device.type)


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """Positional arithmetic runs in float32, or float64 when the input already is (the property tests)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def pad_prefix_bias(bias: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """Give prefix tokens a zero bias row and column: (..., N, N) -> (..., P+N, P+N)."""
    if num_prefix_tokens == 0:
        return bias
    return F.pad(bias, (num_prefix_tokens, 0, num_prefix_tokens, 0))


class PositionEncoding(nn.Module):
    """Base class: every hook is the identity, an encoding overrides the hooks of its mechanisms.

    Subclasses set the class attributes below; the documentation's encoding table is generated from them.
    """

    name: ClassVar[str] = ""
    mechanisms: ClassVar[tuple[str, ...]] = ()
    supported_ndims: ClassVar[tuple[int, ...]] = (1, 2, 3)
    #: True when attention never needs an N x N tensor (fused SDPA with no attn_mask)
    fused: ClassVar[bool] = True
    #: True when positions must be whole cells of a grid (a learned table, counts along rows and columns): tokens at
    #: free coordinates (point clouds, events in continuous time) are refused
    grid_cells: ClassVar[bool] = False
    paper: ClassVar[str] = ""

    def __init__(self, ctx: EncodingContext) -> None:
        super().__init__()
        self.check_ndim(self.name or type(self).__name__, ctx)
        if ctx.dim % ctx.num_heads:
            raise ValueError(f"embed dim {ctx.dim} is not divisible by num_heads {ctx.num_heads}")
        self.ctx = ctx
        self._cache: dict[Any, Any] = {}

    @classmethod
    def check_ndim(cls, name: str, ctx: EncodingContext) -> None:
        """Refuse a grid whose dimensionality the method is not defined for, naming both."""
        if ctx.ndim not in cls.supported_ndims:
            kinds = {1: "sequences", 2: "images", 3: "videos"}
            dims = ", ".join(f"{d}-D ({kinds[d]})" for d in cls.supported_ndims)
            raise ValueError(
                f"position encoding {name!r} is defined for {dims} inputs only, "
                f"but the model has a {ctx.ndim}-D patch grid {tuple(ctx.grid_size)}"
            )

    # --- the three hooks -------------------------------------------------------------------------
    def add_to_tokens(self, x: torch.Tensor, pos: TokenPositions) -> torch.Tensor:
        """x: (B, P+N, D) with the prefix tokens first. Returns the same shape."""
        return x

    def prepare(self, pos: TokenPositions) -> Any:
        """Per-forward state shared by all layers (angles, rotations, cached biases)."""
        return None

    def transform_qk(self, layer: int, qk: torch.Tensor, x: torch.Tensor, state: Any) -> torch.Tensor:
        """qk: queries and keys stacked, (2, B, heads, P+N, head_dim) (a view of the qkv projection); x: (B, P+N, D),
        the block's normed input. Returns the transformed stack; it may be wider (queries and keys the same width),
        and attention then pads v to match.
        """
        return qk

    def attn_bias(self, layer: int, q: torch.Tensor, k: torch.Tensor, state: Any) -> torch.Tensor | None:
        """Additive logit bias, added after the q.k scaling: (heads, P+N, P+N) or (B, heads, P+N, P+N)."""
        return None

    def bias_batch(self, state: Any, batch: int) -> int:
        """How many samples' biases one layer's attention holds: ``batch`` by default (a bias per sample); 1 where
        the batch shares one (a content-free bias of one grid), which :func:`blockwise` then counts once."""
        return batch

    def attn_bias_rows(self, layer: int, q: torch.Tensor, k: torch.Tensor, state: Any
                       ) -> Callable[[int, int], torch.Tensor] | BiasRows | None:
        """The bias one block of query rows at a time, for long sequences (:data:`BLOCKWISE_FROM`): a function of
        (start, stop) giving rows ``start:stop`` of :meth:`attn_bias`, (heads | B, heads, stop - start, P+N), exactly;
        a :class:`BiasRows` where those rows need gradients. None: the encoding has no blockwise form, and attention
        takes the whole bias."""
        return None

    def set_grid_size(self, grid_size: tuple[int, ...], old_grid_size: tuple[int, ...]) -> None:
        """The model's nominal grid changed (``set_input_size``): learned tables follow, caches drop."""
        self.ctx = replace(self.ctx, grid_size=tuple(grid_size))
        self._cache = {}
        for child in self.children():
            if isinstance(child, PositionEncoding):
                child.set_grid_size(grid_size, old_grid_size)

    def reset_parameters(self) -> None:
        """(Re)initialise this encoding's own parameters and buffers (child encodings reset their own): what the
        constructor does, and what ``init_weights()`` runs after a model was built on the meta device and moved
        with ``to_empty``. Encodings with parameters or buffers override it and call it from their constructor."""

    # --- helpers for subclasses ------------------------------------------------------------------
    def no_weight_decay(self) -> set[str]:
        """Names (relative to this module) of parameters to exclude from weight decay."""
        return set()

    def cached(self, key: Any, build: Callable[[], Any], depends_on_params: bool = False, slot: str = "grid") -> Any:
        """Build once per key. The key carries the version counters of the encoding's parameters and buffers, so
        an optimizer step or a weight load (which writes them in place) invalidates the entry. State built from
        learned parameters (``depends_on_params``) is not cached while gradients can flow into them. A key of None
        (per-token coordinates, which change with every batch) builds every time. One entry per ``slot``: a model is
        usually run at one resolution at a time, and entries can be large; a second kind of state (LieRE's cells of
        NaFlex batches) takes a slot of its own, so that batches of either kind do not evict the other's."""
        if key is None or torch.compiler.is_compiling():  # compiled graphs fold the build in; no Python cache
            return build()
        if depends_on_params and differentiated(*self.parameters()):
            return build()
        tensors = [*self.parameters(), *self.buffers()]
        # tensors made under inference_mode cannot enter autograd later: keep the two kinds apart
        key = (slot, key, torch.is_inference_mode_enabled(), tuple(t._version for t in tensors),
               tuple(t.data_ptr() for t in tensors))
        hit = self._cache.get(key)
        if hit is None:
            hit = build()
            self._cache = {k: v for k, v in self._cache.items() if k[0] != slot} | {key: hit}
        return hit

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - nn.Module's signature
        self._cache = {}  # .to() / .half(): cached tensors belong to the old device or dtype
        return super()._apply(fn, recurse=recurse)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, mechanisms={self.mechanisms}, grid={tuple(self.ctx.grid_size)}"

    @staticmethod
    def require_grid(pos: TokenPositions, who: str) -> tuple[int, ...]:
        if pos.grid_size is None:
            raise ValueError(f"{who} needs a full patch grid (TokenPositions.grid_size), got free-form coordinates")
        return pos.grid_size
