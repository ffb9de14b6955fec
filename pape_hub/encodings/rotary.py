"""Rotary encodings: queries and keys are rotated pairwise by position-dependent angles.

Shared by axial RoPE, RoPE-Mixed and Polar RoPE: each defines only its phases, shape
(L, H, N, head_dim / 2) with L in {1, depth} and H in {1, heads}. Pairs are interleaved (dims 2i, 2i+1),
LLaMA style, as in naver-ai/rope-vit. Prefix tokens (CLS) are never rotated. Phases and the rotation are
computed in float32 whatever the autocast dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .base import EncodingContext, PositionEncoding, TokenPositions, compute_dtype
from .registry import register_encoding

__all__ = ["AxialRoPE", "PolarRoPE", "RoPEMixed", "RotaryEncoding", "rotate_pairs"]


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of the last dim: x (..., 2K), cos/sin broadcastable to (..., K)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)  # each (..., K)
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


def rotate_patch_tokens(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """t: (B, H, P+N, hd); rotate the N patch tokens in float32, leave the P prefix tokens as they are."""
    rotated = rotate_pairs(t[:, :, num_prefix:].to(cos.dtype), cos, sin).to(t.dtype)
    return torch.cat([t[:, :, :num_prefix], rotated], dim=2) if num_prefix else rotated


class RotaryEncoding(PositionEncoding):
    """Base of the RoPE family: subclasses implement :meth:`phases`."""

    mechanisms = ("qk",)
    #: phases depend on learned parameters (so they are cached only where no gradient flows)
    learned_phases = False

    def __init__(self, ctx: EncodingContext) -> None:
        super().__init__(ctx)
        if ctx.head_dim % 2:
            raise ValueError(f"{self.name} needs an even head dim, got {ctx.head_dim}")

    def phases(self, pos: TokenPositions) -> torch.Tensor:
        """(L, H, N, head_dim / 2) rotation angles in float32."""
        raise NotImplementedError

    def prepare(self, pos: TokenPositions) -> tuple[torch.Tensor, torch.Tensor]:
        def build() -> tuple[torch.Tensor, torch.Tensor]:
            with torch.autocast(pos.coords.device.type, enabled=False):
                ang = self.phases(pos).to(compute_dtype(pos.coords))
                return ang.cos(), ang.sin()

        return self.cached(pos.cache_key(), build, depends_on_params=self.learned_phases)

    def transform_qk(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, state: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = state
        index = layer if cos.shape[0] > 1 else 0
        cos, sin = cos[index], sin[index]  # (H or 1, N, hd/2)
        p = self.ctx.num_prefix_tokens
        return rotate_patch_tokens(q, cos, sin, p), rotate_patch_tokens(k, cos, sin, p)


def axial_frequencies(head_dim: int, ndim: int, theta: float) -> torch.Tensor:
    """``head_dim / (2 ndim)`` frequencies per axis: 1 / theta^(2 ndim k / head_dim)."""
    step = 2 * ndim
    return 1.0 / theta ** (torch.arange(0, head_dim, step, dtype=torch.float32)[: head_dim // step] / head_dim)


@register_encoding("rope")
class AxialRoPE(RotaryEncoding):
    """Axial RoPE (Su et al.; VisionLLaMA; rope-vit's ``compute_axial_cis``).

    ``head_dim / 4`` frequencies per axis for images (``head_dim / (2p)`` in p-D), theta 100; the first
    pairs carry x, the next y (then t). Positions are integer patch indices from 0 (extrapolation at other
    grids, as in the paper); nothing is learned. Pairs left over when head_dim is not a multiple of 2p stay
    unrotated.
    """

    paper = "RoPE (Su et al. 2024), axial (Chu et al. 2024; Heo et al. 2024)"

    def __init__(self, ctx: EncodingContext, theta: float = 100.0) -> None:
        super().__init__(ctx)
        self.theta = theta
        self.register_buffer("freqs", axial_frequencies(ctx.head_dim, ctx.ndim, theta))

    def phases(self, pos: TokenPositions) -> torch.Tensor:
        ang = (pos.coords[:, :, None] * self.freqs.to(pos.coords.dtype)).flatten(1)  # (N, p * F): x freqs, then y, (t)
        ang = nn.functional.pad(ang, (0, self.ctx.head_dim // 2 - ang.shape[-1]))
        return ang[None, None]  # (1, 1, N, hd/2)


@register_encoding("rope_mixed")
class RoPEMixed(RotaryEncoding):
    """RoPE-Mixed (Heo et al. 2024): learned 2-D frequency vectors per layer, head and pair.

    Phase = x * fx + y * fy. Init as rope-vit's ``init_random_2d_freqs``: magnitudes 1/theta^(4k/hd)
    (theta 10), one random angle a per layer and head, half the pairs along a and half along a + 90 deg.
    The parameter is named ``freqs`` and excluded from weight decay. The phase stays linear in (x, y), so
    scores remain relative.
    """

    paper = "RoPE-Mixed (Heo et al. 2024)"
    supported_ndims = (2,)
    learned_phases = True

    def __init__(self, ctx: EncodingContext, theta: float = 10.0) -> None:
        super().__init__(ctx)
        self.theta = theta
        mag = axial_frequencies(ctx.head_dim, 2, theta)  # (hd/4,)
        angle = torch.rand(ctx.depth, ctx.num_heads, 1) * 2 * math.pi  # one random direction per layer/head
        fx = torch.cat([mag * torch.cos(angle), mag * torch.cos(angle + math.pi / 2)], dim=-1)
        fy = torch.cat([mag * torch.sin(angle), mag * torch.sin(angle + math.pi / 2)], dim=-1)
        freqs = torch.stack([fx, fy], dim=2)  # (depth, heads, 2, hd/2 rounded down to a multiple of 2)
        self.freqs = nn.Parameter(nn.functional.pad(freqs, (0, ctx.head_dim // 2 - freqs.shape[-1])))

    def phases(self, pos: TokenPositions) -> torch.Tensor:
        dtype = compute_dtype(pos.coords)
        return torch.einsum("np,lhpk->lhnk", pos.coords.to(dtype), self.freqs.to(dtype))

    def no_weight_decay(self) -> set[str]:
        return {"freqs"}


@register_encoding("polar_rope")
class PolarRoPE(RotaryEncoding):
    """Polar RoPE: rotary phases from polar coordinates about the grid centre.

    Centre ((W-1)/2, (H-1)/2) (eq. 20), r = |(x', y')|, theta = atan2(y', x') in (-pi, pi] with y growing
    downwards (eq. 21). The first half of each head is rotated by r * w_j, the second half by
    theta * w_j, w_j = 10000^(-2j / (hd/2)), j < hd/4 (eq. 23). CLS is not rotated. Images only.
    """

    paper = "Polar RoPE (Korea University 2025)"
    supported_ndims = (2,)

    def __init__(self, ctx: EncodingContext, base: float = 10000.0) -> None:
        super().__init__(ctx)
        if ctx.head_dim % 4:
            raise ValueError(f"polar_rope needs a head dim divisible by 4, got {ctx.head_dim}")
        half = ctx.head_dim // 2
        omega = 1.0 / base ** (torch.arange(0, half, 2, dtype=torch.float32) / half)  # (hd/4,)
        self.register_buffer("omega", omega)

    @staticmethod
    def polar(coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, 2) -> radius and angle about the centre of the coordinates' bounding box."""
        centre = (coords.amin(0) + coords.amax(0)) / 2  # ((W-1)/2, (H-1)/2) on a full grid
        x, y = (coords - centre).unbind(-1)
        return torch.hypot(x, y), torch.atan2(y, x)

    def phases(self, pos: TokenPositions) -> torch.Tensor:
        r, theta = self.polar(pos.coords.to(compute_dtype(pos.coords)))
        omega = self.omega.to(r.dtype)
        ang = torch.cat([r[:, None] * omega, theta[:, None] * omega], dim=-1)  # (N, hd/2)
        return ang[None, None]
