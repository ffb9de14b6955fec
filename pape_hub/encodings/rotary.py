"""Rotary encodings: queries and keys are rotated pairwise by position-dependent angles.

Shared by axial RoPE, RoPE-Mixed and Polar RoPE: each defines only its phases, shape
(L, B', H, N, head_dim / 2) with L in {1, depth}, B' in {1, batch} (a grid shared by the batch, or each sample's own
coordinates) and H in {1, heads}. Each token is rotated by its own coordinate, so the order of the tokens does not
matter. ``with_ape`` adds a learned absolute table of
the patch cells to the tokens as well (none for CLS; Naver's ``*_ape`` models: ``rope_ape``, ``rope_mixed_ape``).
Pairs are interleaved (dims 2i, 2i+1), LLaMA style, as in naver-ai/rope-vit. Prefix tokens (CLS) are never
rotated. Phases and the rotation are computed in float32 whatever the autocast dtype.

Once per forward the phases become two full-width tables over every token: ``cos`` repeated per pair and
``sin`` with the pair's signs, ``(-sin, +sin)``, prefix rows 1 and 0 (no rotation). A layer then rotates queries
and keys together with three elementwise kernels, ``x * cos + swap_pairs(x) * sin``, with no slicing, stacking
or concatenation.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import nn

from .absolute import AddsLearnedTable
from .base import STATE_BYTES, EncodingContext, PositionEncoding, TokenPositions, compute_dtype, full_precision
from .registry import register_encoding

__all__ = ["AxialRoPE", "DINOv3RoPE", "PolarRoPE", "RoPEMixed", "RotaryEncoding", "rotate_pairs", "rotation_tables"]


def rotation_tables(phases: torch.Tensor, num_prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Phases (..., N, K) -> full-width tables (..., P+N, 2K): cos per pair, and sin signed (-sin, +sin) per pair;
    the P prefix rows are cos 1, sin 0."""
    cos = phases.cos().repeat_interleave(2, dim=-1)
    sin = torch.stack([-phases.sin(), phases.sin()], dim=-1).flatten(-2)
    pad = (0, 0, num_prefix, 0)
    return nn.functional.pad(cos, pad, value=1.0), nn.functional.pad(sin, pad)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the interleaved pairs (2i, 2i+1) of the last dim by the tables of :func:`rotation_tables`:
    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), in the tables' precision where it is higher than ``x``'s
    (float32 tables under bf16 autocast): type promotion widens ``x`` inside each kernel, so no widened copy of
    ``x`` is held, and the sum accumulates in place (one float32 tensor of x's size, not four: ViT-B/16 at 1024 px,
    batch 8, held 436 MB more than a plain ViT at its peak on an H200 with the copies)."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (x2, x1) per pair, in x's dtype
    return (x * cos).addcmul_(swapped, sin)


class LayerCoords(NamedTuple):
    """The per-forward state of an encoding that makes each layer's tables in that layer: coordinates (B', N, p)."""

    coords: torch.Tensor
    num_prefix_tokens: int


class RotaryEncoding(AddsLearnedTable, PositionEncoding):
    """Base of the RoPE family: subclasses implement :meth:`phases`; ``with_ape`` also adds a learned table of the
    patch cells (no CLS row) to the tokens."""

    mechanisms = ("qk",)
    #: phases depend on learned parameters (so they are cached only where no gradient flows)
    learned_phases = False

    def __init__(self, ctx: EncodingContext, with_ape: bool = False) -> None:
        super().__init__(ctx)
        if ctx.head_dim % 2:
            raise ValueError(f"{self.name} needs an even head dim, got {ctx.head_dim}")
        self.add_learned_table(ctx, with_ape, prefix_slots=False)

    def no_weight_decay(self) -> set[str]:
        return self.table_no_weight_decay()

    def phases(self, pos: TokenPositions) -> torch.Tensor:
        """(L, B', H, N, head_dim / 2) rotation angles in float32."""
        raise NotImplementedError

    def prepare(self, pos: TokenPositions) -> tuple[torch.Tensor, torch.Tensor] | LayerCoords:
        """(cos, signed sin) tables, (L, B', H, P+N, head_dim), float32 (float64 for float64 positions); where the
        tables of every layer would exceed :data:`STATE_BYTES` (RoPE-Mixed on large grids), the coordinates, from
        which each layer makes its own (:meth:`layer_phases`)."""
        if type(self).layer_phases is not RotaryEncoding.layer_phases and self.table_bytes(pos) > STATE_BYTES:
            return LayerCoords(pos.sample_coords().to(compute_dtype(pos.coords)), pos.num_prefix_tokens)

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            with full_precision(pos.coords.device):
                return rotation_tables(self.phases(pos).to(compute_dtype(pos.coords)), pos.num_prefix_tokens)

        return self.cached(pos.cache_key(), build, depends_on_params=self.learned_phases)

    def table_bytes(self, pos: TokenPositions) -> int:
        """What the (cos, sin) tables of every layer would take: 2 x (L, B', H, P+N, head_dim) float32."""
        batch = pos.coords.shape[0] if pos.per_sample else 1
        tokens = pos.num_patches + pos.num_prefix_tokens
        return 2 * 4 * self.ctx.depth * batch * self.ctx.num_heads * tokens * self.ctx.head_dim

    def layer_phases(self, coords: torch.Tensor, layer: int) -> torch.Tensor:
        """(1, B', H, N, head_dim / 2): one layer's rotation angles of ``coords`` (B', N, p); encodings whose phases
        differ per layer implement it, so large grids need not hold every layer's tables."""
        raise NotImplementedError

    def transform_qk(self, layer: int, qk: torch.Tensor, x: torch.Tensor, state: Any) -> torch.Tensor:
        if isinstance(state, LayerCoords):  # this layer's tables only, made now
            with full_precision(qk.device):
                phases = self.layer_phases(state.coords, layer).to(state.coords.dtype)
                cos, sin = rotation_tables(phases, state.num_prefix_tokens)
        else:
            cos, sin = state
        index = layer if cos.shape[0] > 1 else 0
        return rotate_pairs(qk, cos[index], sin[index]).to(qk.dtype)


def axial_frequencies(head_dim: int, ndim: int, theta: float) -> torch.Tensor:
    """``head_dim / (2 ndim)`` frequencies per axis: 1 / theta^(2 ndim k / head_dim)."""
    step = 2 * ndim
    return 1.0 / theta ** (torch.arange(0, head_dim, step, dtype=torch.float32)[: head_dim // step] / head_dim)


@register_encoding("rope_ape", with_ape=True)
@register_encoding("rope")
class AxialRoPE(RotaryEncoding):
    """Axial RoPE (Su et al.; VisionLLaMA; rope-vit's ``compute_axial_cis``).

    ``head_dim / 4`` frequencies per axis for images (``head_dim / (2p)`` in p-D), theta 100; the first
    pairs carry x, the next y (then t). Positions are integer patch indices from 0 (extrapolation at other
    grids, as in the paper); nothing is learned. Pairs left over when head_dim is not a multiple of 2p stay
    unrotated.
    """

    paper = "RoPE (Su et al. 2024), axial (Chu et al. 2024; Heo et al. 2024)"

    def __init__(self, ctx: EncodingContext, theta: float = 100.0, with_ape: bool = False) -> None:
        super().__init__(ctx, with_ape)
        self.theta = theta
        self.register_buffer("freqs", torch.empty(ctx.head_dim // (2 * ctx.ndim)))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.freqs.copy_(axial_frequencies(self.ctx.head_dim, self.ctx.ndim, self.theta))

    def phases(self, pos: TokenPositions) -> torch.Tensor:
        return self.axial_phases(pos.sample_coords())

    def axial_phases(self, coords: torch.Tensor) -> torch.Tensor:
        """(B', N, p) coordinates -> (1, B', 1, N, hd/2): each axis's coordinate times its frequencies."""
        ang = (coords[..., None] * self.freqs.to(coords.dtype)).flatten(-2)  # (B', N, p * F): x freqs, then y, (t)
        ang = nn.functional.pad(ang, (0, self.ctx.head_dim // 2 - ang.shape[-1]))
        return ang[None, :, None]  # (1, B', 1, N, hd/2)


@register_encoding("rope_dinov3")
class DINOv3RoPE(AxialRoPE):
    """Axial RoPE with DINOv3's image-relative coordinates (Simeoni et al. 2025; timm's ``RotaryEmbeddingDinoV3``).

    The frequencies are :class:`AxialRoPE`'s (DINOv3's period 100^(4k/head_dim) is frequency 1/theta^(4k/hd)); the
    coordinate differs: patch index i of an axis with n patches becomes c = 2 (i + 0.5) / n - 1, the patch centre
    in [-1, 1], and the angle is 2 pi c / period. Every resolution spans the same range, so a larger grid is
    interpolated by construction (``position_interpolation`` changes nothing). Prefix tokens (CLS, registers) are not
    rotated. DINOv3 pairs channels rotate-half with y first, this package interleaved with x first; the two differ by
    a fixed permutation of the q/k channels, which the checkpoint converter applies
    (:func:`pape_hub.models.pretrained.dinov3_qk_order`). DINOv3's training-time coordinate augmentations (shift,
    jitter, rescale) are not implemented.
    """

    paper = "DINOv3 RoPE (Simeoni et al. 2025)"
    supported_ndims = (2,)

    def phases(self, pos: TokenPositions) -> torch.Tensor:
        dtype = compute_dtype(pos.coords)
        index = pos.sample_coords().to(dtype) / pos.axis_scale.to(dtype)  # patch indices, whatever the interpolation
        if pos.grid_size is not None and not pos.per_sample:
            sizes = torch.tensor(pos.grid_size[::-1], dtype=dtype, device=index.device)  # (W, H): coordinate order
        else:  # each image's own grid, its highest index + 1 (timm's NaFlex DINOv3 RoPE), (B', N, p)
            sizes = pos.sample_grid_sizes().to(dtype)
        return self.axial_phases(2 * math.pi * (2 * (index + 0.5) / sizes - 1))


def random_orthonormal_directions(depth: int, heads: int, p: int) -> torch.Tensor:
    """(depth, heads, p, p): per layer and head, p orthonormal directions (the columns) of p-D position space.

    2-D: one random angle a, directions a and a + 90 deg (rope-vit's ``init_random_2d_freqs``). 3-D and up: the
    columns of a random rotation (QR of a Gaussian matrix, signs fixed so it is Haar-distributed)."""
    if p == 2:
        angle = torch.rand(depth, heads) * 2 * math.pi
        first = torch.stack([angle.cos(), angle.sin()], dim=-1)  # (depth, heads, 2)
        second = torch.stack([(angle + math.pi / 2).cos(), (angle + math.pi / 2).sin()], dim=-1)
        return torch.stack([first, second], dim=-1)
    q, r = torch.linalg.qr(torch.randn(depth, heads, p, p))
    return q * torch.diagonal(r, dim1=-2, dim2=-1).sign()[..., None, :]


@register_encoding("rope_mixed_ape", with_ape=True)
@register_encoding("rope_mixed")
class RoPEMixed(RotaryEncoding):
    """RoPE-Mixed (Heo et al. 2024): learned p-D frequency vectors per layer, head and pair.

    Phase = x * fx + y * fy (+ t * ft for video). Init as rope-vit's ``init_random_2d_freqs``: magnitudes
    1/theta^(2pk/hd) (theta 10), per layer and head p orthonormal random directions, an equal share of the pairs
    along each (images: a random angle a, half the pairs along a and half along a + 90 deg). The 3-D init (three
    orthogonal directions of a random rotation) is this project's extension of that rule; rope-vit is 2-D only.
    The parameter is named ``freqs`` and excluded from weight decay. The phase stays linear in the position, so
    scores remain relative.
    """

    paper = "RoPE-Mixed (Heo et al. 2024)"
    supported_ndims = (2, 3)
    learned_phases = True

    def __init__(self, ctx: EncodingContext, theta: float = 10.0, with_ape: bool = False) -> None:
        super().__init__(ctx, with_ape)
        self.theta = theta
        self.freqs = nn.Parameter(torch.empty(ctx.depth, ctx.num_heads, ctx.ndim, ctx.head_dim // 2))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        ctx, p = self.ctx, self.ctx.ndim
        mag = axial_frequencies(ctx.head_dim, p, self.theta)  # (hd / 2p,)
        directions = random_orthonormal_directions(ctx.depth, ctx.num_heads, p)  # (depth, heads, axis, group)
        freqs = (directions[..., None] * mag).flatten(-2)  # (depth, heads, p, p * hd/2p): group g's pairs along g
        self.freqs.copy_(nn.functional.pad(freqs, (0, ctx.head_dim // 2 - freqs.shape[-1])))

    def phases(self, pos: TokenPositions) -> torch.Tensor:
        dtype = compute_dtype(pos.coords)
        return torch.einsum("bnp,lhpk->lbhnk", pos.sample_coords().to(dtype), self.freqs.to(dtype))

    def layer_phases(self, coords: torch.Tensor, layer: int) -> torch.Tensor:
        return torch.einsum("bnp,hpk->bhnk", coords, self.freqs[layer].to(coords.dtype))[None]

    def no_weight_decay(self) -> set[str]:
        return {"freqs"} | super().no_weight_decay()


@register_encoding("polar_rope")
class PolarRoPE(RotaryEncoding):
    """Polar RoPE: rotary phases from polar coordinates about the grid centre.

    Centre ((W-1)/2, (H-1)/2) (eq. 20), r = |(x', y')|, theta = atan2(y', x') in (-pi, pi] with y growing
    downwards (eq. 21). The first half of each head is rotated by r * w_j, the second half by
    theta * w_j, w_j = 10000^(-j / K), j < K = hd/4 (eq. 23). CLS is not rotated.

    Video (this project's extension; the paper is 2-D): polar in space, axial in time. The pairs are split in
    three groups of K = (hd/2) // 3, rotated by r * w_j, theta * w_j and t * w_j with the same w_j = 10000^(-j/K);
    pairs left over stay unrotated. Scores depend on (r, theta) of both tokens (not only their difference, as
    in the paper) and on the time offset alone.
    """

    paper = "Polar RoPE (Korea University 2025)"
    supported_ndims = (2, 3)

    def __init__(self, ctx: EncodingContext, base: float = 10000.0) -> None:
        super().__init__(ctx)
        if ctx.ndim == 2 and ctx.head_dim % 4:
            raise ValueError(f"polar_rope needs a head dim divisible by 4, got {ctx.head_dim}")
        groups = ctx.ndim  # r, theta (, t)
        per_group = ctx.head_dim // 2 // groups
        if per_group == 0:
            raise ValueError(f"polar_rope needs a head dim of at least {2 * groups} for {ctx.ndim}-D, got "
                             f"{ctx.head_dim}")
        self.base = base
        self.register_buffer("omega", torch.empty(per_group))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        per_group = self.omega.shape[0]
        self.omega.copy_(1.0 / self.base ** (torch.arange(per_group, dtype=torch.float32) / per_group))  # (K,)

    @staticmethod
    def polar(coords: torch.Tensor, centre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B', N, 2) -> radius and angle about each token's ``centre`` (B', N, 2)."""
        x, y = (coords - centre).unbind(-1)
        # sqrt of the sum of squares, not torch.hypot: ONNX has no hypot, and grid coordinates cannot overflow
        return (x * x + y * y).sqrt(), torch.atan2(y, x)

    def phases(self, pos: TokenPositions) -> torch.Tensor:
        dtype = compute_dtype(pos.coords)
        coords = pos.sample_coords().to(dtype)
        low, high = pos.extent()  # the centre of each image's valid tokens' bounding box: ((W-1)/2, (H-1)/2)
        r, theta = self.polar(coords[..., :2], ((low + high) / 2)[..., :2].to(dtype))
        omega = self.omega.to(r.dtype)
        parts = [r, theta] + ([coords[..., 2]] if coords.shape[-1] == 3 else [])  # time is axial
        ang = torch.cat([v[..., None] * omega for v in parts], dim=-1)  # (B', N, groups * K)
        ang = nn.functional.pad(ang, (0, self.ctx.head_dim // 2 - ang.shape[-1]))
        return ang[None, :, None]  # (1, B', 1, N, hd/2)
