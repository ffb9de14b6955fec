"""PaPE and PaPE-RI: parabolic position encodings (Ohrstrom et al. 2026), run on fused attention.

The paper's score (eq. 9) for query i and key j, with s = W_p r and dr = W_p (r_j - r_i):

    S_ij = <a_i, dr^2> + <b_i, dr> + <q_i, k_j>,   a_i = -softplus(W_a x_i),  b_i = W_b x_i.

Expanding the positional part and dropping what depends on i alone (constant along a softmax row, so it
cancels) leaves a quadratic polynomial in the key's position with query-dependent coefficients:

    <Q_i, r_j r_j^T> + <g_i, r_j>,   Q_i = W_p^T diag(a_i) W_p,   g_i = W_p^T (b_i - 2 a_i * s_i).

So queries gain p(p+1)/2 + p coefficient channels and keys the matching monomials of r_j: 5 extra dims for
images, 9 for video, whatever m is - instead of the paper's 3m + 2 (eq. 13-14). ``b`` enters only through
W_p^T b_i, so W_p^T W_b is folded into one (p x d) map per head. No N x N tensor is formed and attention stays
on ``scaled_dot_product_attention``; like the reference code, the softmax scale stays head_dim^-1/2 of the
original head, so the positional term is scaled with q.k. On a GPU the widened head is zero-padded to a multiple
of 8 channels (what the fused GPU kernels need; the reference pads the same way); CPU kernels take any width and
run faster without the padding.

Cost. Everything that depends on positions and parameters only is made once per forward for all layers (and
cached between forwards at inference): the keys' monomials, s = W_p r, the matrices that turn the curvatures
into quadratic coefficients, and one stacked projection [W_a; W_p^T W_b] per layer. A layer then needs one
linear map of x, a softplus, two small matmuls and the concatenation with q and k - about ten kernels for q and
k together, independent of m.

Positions follow the reference code: patches at integer grid coordinates starting at 1, CLS at the origin
(0, 0), i.e. one step before the first patch on every axis: a token just outside the top-left corner that
gets no special treatment. The polynomial is
evaluated about the grid centre, which changes nothing (the score is translation invariant) and keeps the
monomials small for float16/bfloat16 attention. All positional arithmetic is float32.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .base import (
    STATE_BYTES,
    EncodingContext,
    PositionEncoding,
    TokenPositions,
    autocast_dtype,
    compute_dtype,
    full_precision,
)
from .registry import register_encoding

__all__ = ["PaPE", "PaPERI", "quadratic_key_monomials", "quadratic_query_coefficients", "split_keys",
           "split_queries"]


def _upper_pairs(p: int) -> tuple[list[int], list[int]]:
    """Row and column indices of the upper triangle (diagonal included) of a p x p matrix."""
    pairs = [(u, v) for u in range(p) for v in range(u, p)]
    return [u for u, _ in pairs], [v for _, v in pairs]


def quadratic_key_monomials(r: torch.Tensor) -> torch.Tensor:
    """(..., p) -> (..., p(p+1)/2 + p): [r_u r_v for u <= v, r_u]."""
    rows, cols = _upper_pairs(r.shape[-1])
    return torch.cat([r[..., rows] * r[..., cols], r], dim=-1)


def quadratic_query_coefficients(quad: torch.Tensor, lin: torch.Tensor) -> torch.Tensor:
    """Coefficients matching :func:`quadratic_key_monomials`: quad (..., p, p) symmetric, lin (..., p).

    <coeffs, monomials(r)> = r^T quad r + lin . r; off-diagonal entries count twice.
    """
    p = lin.shape[-1]
    rows, cols = _upper_pairs(p)
    weight = torch.tensor([1.0 if u == v else 2.0 for u, v in zip(rows, cols)], device=quad.device, dtype=quad.dtype)
    return torch.cat([quad[..., rows, cols] * weight, lin], dim=-1)


def split_queries(queries: torch.Tensor, channels: int, dtype: torch.dtype, pad: int) -> torch.Tensor:
    """Positional query channels for attention in a 16-bit ``dtype`` without losing their float32 precision.

    The key monomials grow with the square of the grid (r^2 ~ 1800 at 6x ViT-S/16's grid) while the score needs
    their differences, ``a (r_j - r_i)^2``: rounded to bfloat16 (8 significant bits) the query and key channels
    would each carry errors of several logits. So each float32 channel is written as a 16-bit head and the 16-bit
    rounding of its remainder, ``c = hi + lo``, and the product as ``q_hi k_hi + q_hi k_lo + q_lo k_hi``: queries
    ``[q_hi, q_hi, q_lo]`` against keys ``[k_hi, k_lo, k_hi]`` (:func:`split_keys`), which attention, accumulating
    in float32, sums to within about 2^-16 of the float32 product. Three times the channels (15 for images), still
    no N x N tensor. (..., C + padding) float32 -> (..., 3 C + pad) in ``dtype``."""
    q = queries if queries.shape[-1] == channels else queries[..., :channels]
    hi = q.to(dtype)
    out = torch.cat([hi, hi, (q - hi).to(dtype)], dim=-1)
    return F.pad(out, (0, pad)) if pad else out


def split_keys(keys: torch.Tensor, channels: int, dtype: torch.dtype, pad: int) -> torch.Tensor:
    """The keys' side of :func:`split_queries`: ``[k_hi, k_lo, k_hi]``."""
    k = keys if keys.shape[-1] == channels else keys[..., :channels]
    hi = k.to(dtype)
    out = torch.cat([hi, (k - hi).to(dtype), hi], dim=-1)
    return F.pad(out, (0, pad)) if pad else out


class ParabolicEncoding(PositionEncoding):
    """Shared machinery: positions, the keys' channels, and widening q and k.

    ``position_scale`` multiplies the positions (1, the default, keeps the reference's patch units; the
    reference's ``normalize`` option is another rescaling). The quadratic term grows with its square, so it sets
    how local attention is at initialisation.
    """

    mechanisms = ("qk",)

    def __init__(self, ctx: EncodingContext, position_scale: float = 1.0) -> None:
        super().__init__(ctx)
        if not position_scale > 0:
            raise ValueError(f"{self.name or 'pape'} position_scale must be positive, got {position_scale}")
        self.position_scale = float(position_scale)
        self.channels = self.num_channels(ctx.ndim)

    def padding(self, device: torch.device) -> int:
        """Zero channels that make the widened head a multiple of 8 on a GPU (none on CPU)."""
        return -(self.ctx.head_dim + self.channels) % 8 if device.type != "cpu" else 0

    @staticmethod
    def num_channels(p: int) -> int:
        """Extra query/key channels for p-D positions."""
        raise NotImplementedError

    def token_positions(self, pos: TokenPositions) -> torch.Tensor:
        """(P+N, p) positions ((B, P+N, p) for per-token coordinates): patches at grid index + 1 (times the
        interpolation factor), prefix tokens one step before the first patch (the reference's origin), all shifted
        by the centre of the (valid) patches. Per sample, "first" and the centre are that sample's own, so a sample
        scores the same alone, padded, shuffled or shifted."""
        step = pos.axis_scale.to(compute_dtype(pos.coords))
        low, high = pos.extent()  # (B', N, p): each token's image, over its valid tokens
        centre = (low + high).to(step.dtype) / 2 + step
        patches = pos.sample_coords().to(step.dtype) - centre + step  # (B', N, p)
        prefix = (low[:, :1].to(step.dtype) - centre[:, :1]).expand(-1, pos.num_prefix_tokens, -1)  # (B', P, p)
        r = torch.cat([prefix, patches], dim=1) * self.position_scale  # (B', P+N, p)
        return r if pos.per_sample else r[0]

    def key_channels(self, r: torch.Tensor) -> torch.Tensor:
        """(..., T, p) positions -> (..., T, channels) monomials the keys gain."""
        raise NotImplementedError

    def layer_state(self, r: torch.Tensor, padding: int) -> dict[str, torch.Tensor]:
        """Tensors every layer needs that depend on positions (``r`` (B', T, p)) and parameters only, stacked over
        layers."""
        raise NotImplementedError

    def query_channels(self, layer: int, x: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """x (B, T, D) -> (B, H, T, channels + padding) query coefficients of layer ``layer``."""
        raise NotImplementedError

    def prepare(self, pos: TokenPositions) -> dict[str, Any]:
        """Positions, the keys' channels (in the dtype q and k have: autocast's, else the positions'), and the
        per-layer state as one tensor per layer (a layer takes its own without an indexing op)."""
        device = pos.coords.device
        working = autocast_dtype(device)

        def build() -> dict[str, Any]:
            with full_precision(device):
                r = self.token_positions(pos)
                r = r if r.ndim == 3 else r[None]  # (B', T, p): B' = 1 for a grid shared by the batch
                padding = self.padding(r.device)
                keys = F.pad(self.key_channels(r), (0, padding))  # (B', T, channels + padding), float32 (or 64)
                layers = {name: tuple(t.unbind(0)) for name, t in self.layer_state(r, padding).items()}
                keys = keys[:, None]  # (B', 1, T, E): broadcast over heads
                wide = split_keys(keys, self.channels, working, self.padding_split(r.device)) \
                    if working in (torch.bfloat16, torch.float16) else None
                return dict(r=r, keys=keys, wide_keys=wide, **layers)

        key = pos.cache_key()  # None for per-token coordinates: built for every batch, never kept
        return self.cached(key and (key, working), build, depends_on_params=True)

    def padding_split(self, device: torch.device) -> int:
        """Zero channels that make the head widened by :func:`split_queries` a multiple of 8 on a GPU."""
        return -(self.ctx.head_dim + 3 * self.channels) % 8 if device.type != "cpu" else 0

    #: whether the query channels are computed in float32 under autocast. tests/test_precision.py decides it per
    #: encoding in float64 at 4x and 6x the training grid: with the channels' float32 precision kept into attention
    #: (:func:`split_queries`), a bf16 projection is what is left of the error, for PaPE (9x) and PaPE-RI (1.4-1.7x)
    float32_projection = True

    def transform_qk(self, layer: int, qk: torch.Tensor, x: torch.Tensor, state: Any) -> torch.Tensor:
        keys = state["keys"]
        if self.float32_projection or autocast_dtype(x.device) is None:
            with full_precision(x.device):  # the positions' precision: float32, or float64 in the property tests
                queries = self.query_channels(layer, x.to(state["r"].dtype), state)  # (B, H, T, E)
        else:  # the autocast dtype, as q and k themselves
            queries = self.query_channels(layer, x, state)
        if qk.dtype in (torch.bfloat16, torch.float16):  # 16-bit attention: keep the channels' float32 precision
            pad = self.padding_split(x.device)
            wide = state["wide_keys"] if state["wide_keys"] is not None and state["wide_keys"].dtype == qk.dtype \
                else split_keys(keys, self.channels, qk.dtype, pad)
            queries, keys = split_queries(queries, self.channels, qk.dtype, pad), wide  # already in qk's dtype
        else:
            queries, keys = queries.to(qk.dtype), keys.to(qk.dtype)
        extra = torch.stack([queries, keys.expand_as(queries)])  # (2, B, H, T, E)
        return torch.cat([qk, extra], dim=-1)


@register_encoding("pape")
class PaPE(ParabolicEncoding):
    """PaPE: m parabolas per head with content-dependent curvature a (< 0) and tilt b.

    Per layer: W_p (heads, m, p) ``position_proj``, W_a and W_b (d -> heads * m) ``curvature_proj`` and
    ``tilt_proj`` applied to the block's normed input (the reference uses one Linear d -> 2 heads m with the
    same parameters). Default m = 50, the paper's setting. Initialised like ``nn.Linear`` (uniform Kaiming),
    as in the paper. Weight decay: W_p is a function of position alone, so like every position parameter in this
    package it gets none; W_a and W_b read the token content and are decayed like any other linear layer.
    """

    paper = "PaPE (Ohrstrom et al. 2026), eq. 9 via fused q/k augmentation"

    def __init__(self, ctx: EncodingContext, num_parabolas: int = 50, position_scale: float = 1.0) -> None:
        super().__init__(ctx, position_scale)
        self.num_parabolas = m = num_parabolas
        h, p, d = ctx.num_heads, ctx.ndim, ctx.dim
        self.position_proj = nn.Parameter(torch.empty(ctx.depth, h, m, p))
        self.curvature_proj = nn.Parameter(torch.empty(ctx.depth, h * m, d))
        self.tilt_proj = nn.Parameter(torch.empty(ctx.depth, h * m, d))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's default init, per layer: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
        p, d = self.ctx.ndim, self.ctx.dim
        nn.init.uniform_(self.position_proj, -1 / math.sqrt(p), 1 / math.sqrt(p))
        nn.init.uniform_(self.curvature_proj, -1 / math.sqrt(d), 1 / math.sqrt(d))
        nn.init.uniform_(self.tilt_proj, -1 / math.sqrt(d), 1 / math.sqrt(d))

    @staticmethod
    def num_channels(p: int) -> int:
        return p * (p + 1) // 2 + p

    def key_channels(self, r: torch.Tensor) -> torch.Tensor:
        return quadratic_key_monomials(r)

    def layer_state(self, r: torch.Tensor, padding: int) -> dict[str, torch.Tensor]:
        """With sp = softplus(W_a x) (so a = -sp), head h's query channels are ``sp_h Q_h + (sp_h * s_h) L_h +
        (W_p^T W_b)_h x``; for all heads at once that is one matrix product ``[sp, sp * s, x] @ coefficients``,
        the per-head maps placed block-diagonally and the folded tilt below them. So a layer costs the curvature
        projection, a softplus, a product with the positions, one concatenation and one matrix product."""
        depth, h, m, p = self.position_proj.shape
        w_p = self.position_proj.to(r.dtype)  # (L, H, m, p)
        rows, cols = _upper_pairs(p)
        q = len(rows)
        weight = torch.tensor([1.0 if u == v else 2.0 for u, v in zip(rows, cols)], dtype=r.dtype, device=r.device)
        quad = -w_p[..., rows] * w_p[..., cols] * weight  # (L, H, m, q): -W_p^T diag(.) W_p entries
        lin = 2 * w_p  # (L, H, m, p): -2 W_p^T (a * s) = 2 W_p^T (sp * s)
        per_head = torch.stack([F.pad(quad, (0, p + padding)), F.pad(lin, (q, padding))], dim=1)  # (L, 2, H, m, C)
        heads = torch.eye(h, dtype=r.dtype, device=r.device)
        positional = torch.einsum("lshmc,hg->lshmgc", per_head, heads).reshape(depth, 2 * h * m, -1)  # rows:
        # (sp or sp * s, head, parabola); columns: (head, channel), zero outside each head's own block
        tilt = torch.einsum("lhmp,lhmd->ldhp", w_p, self.tilt_proj.to(r.dtype).unflatten(1, (h, m)))  # W_p^T W_b
        tilt = F.pad(tilt, (q, padding)).flatten(2)  # (L, d, H C): zero for the quadratic and padding channels
        state = dict(curvature=self.curvature_proj.to(r.dtype).transpose(1, 2).contiguous(),  # (L, d, H m)
                     coefficients=torch.cat([positional, tilt], dim=1))  # (L, 2 H m + d, H C)
        if depth * r.shape[0] * r.shape[1] * h * m * 4 <= STATE_BYTES:  # every layer's projected positions at once
            state["s"] = torch.einsum("lhmp,btp->lbthm", w_p, r).flatten(-2)  # (L, B', T, H m)
        return state  # on large grids each layer projects its own (:meth:`projected_positions`)

    def projected_positions(self, layer: int, r: torch.Tensor) -> torch.Tensor:
        """s = W_p r of one layer: (B', T, H m)."""
        return torch.einsum("hmp,btp->bthm", self.position_proj[layer].to(r.dtype), r).flatten(-2)

    def query_channels(self, layer: int, x: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        sp = F.softplus(x @ state["curvature"][layer].to(x.dtype))  # (B, T, H m) = -a
        s = state["s"][layer] if "s" in state else self.projected_positions(layer, state["r"])
        terms = torch.cat([sp, sp * s.to(sp.dtype), x], dim=-1)  # (B, T, 2 H m + d)
        out = terms @ state["coefficients"][layer].to(terms.dtype)  # (B, T, H C)
        return out.unflatten(-1, (self.ctx.num_heads, -1)).transpose(1, 2)  # (B, H, T, C)

    def coefficients(self, layer: int, x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The query's quadratic form, written out (for tests and reading; the forward uses the folded state):
        quad (B, H, T, p, p) = W_p^T diag(a_i) W_p, lin (B, H, T, p) = W_p^T (b_i - 2 a_i * s_i)."""
        h, m = self.ctx.num_heads, self.num_parabolas
        w_p = self.position_proj[layer].to(x.dtype)  # (H, m, p)
        a = -F.softplus(F.linear(x, self.curvature_proj[layer].to(x.dtype))).unflatten(-1, (h, m)).transpose(1, 2)
        b = F.linear(x, self.tilt_proj[layer].to(x.dtype)).unflatten(-1, (h, m)).transpose(1, 2)
        s = torch.einsum("hmp,tp->htm", w_p, r)
        lin = torch.einsum("bhtm,hmp->bhtp", b - 2 * a * s, w_p)
        quad = torch.einsum("bhtm,hmu,hmv->bhtuv", a, w_p, w_p)
        return quad, lin

    def no_weight_decay(self) -> set[str]:
        return {"position_proj"}

    def pairwise_scores(self, layer: int, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor,
                        pos: TokenPositions) -> torch.Tensor:
        """The paper's eq. 9 computed literally, (B, H, T, T), for tests: S_ij before the softmax scale."""
        h, m = self.ctx.num_heads, self.num_parabolas
        r = self.token_positions(pos).to(x.dtype)
        w_p = self.position_proj[layer].to(x.dtype)
        a = -F.softplus(F.linear(x, self.curvature_proj[layer].to(x.dtype))).unflatten(-1, (h, m)).transpose(1, 2)
        b = F.linear(x, self.tilt_proj[layer].to(x.dtype)).unflatten(-1, (h, m)).transpose(1, 2)
        dr = torch.einsum("hmp,ijp->hijm", w_p, r[None, :, :] - r[:, None, :])  # W_p (r_j - r_i)
        return (torch.einsum("bhim,hijm->bhij", a, dr**2) + torch.einsum("bhim,hijm->bhij", b, dr)
                + q @ k.transpose(-1, -2))


@register_encoding("pape_ri")
class PaPERI(ParabolicEncoding):
    """PaPE-RI: b = 0, one curvature a_i < 0 per token and head, W_p = w I.

    The positional term is a_i w^2 ||r_j - r_i||^2, translation and rotation invariant. As in the reference
    code w is a fixed random per-head scale drawn from U(-sqrt(1/p), sqrt(1/p)) (a buffer); the paper leaves
    open whether w is learned. ``learned_scale=True`` makes w a parameter (a position parameter: no weight decay),
    so heads that start nearly position-blind (w near 0) can become positional. The curvature projection reads
    token content and is weight-decayed like any linear layer.

    Without cross terms only 2p channels are needed: queries ``a w^2 [1, .., 1, -2 r_i]`` (the bracket is
    prepared once, so a layer multiplies it by its curvatures) and keys ``[r_j^2, r_j]``.
    """

    paper = "PaPE-RI (Ohrstrom et al. 2026)"

    def __init__(self, ctx: EncodingContext, position_scale: float = 1.0, learned_scale: bool = False) -> None:
        super().__init__(ctx, position_scale)
        d, h = ctx.dim, ctx.num_heads
        self.curvature_proj = nn.Parameter(torch.empty(ctx.depth, h, d))
        self.learned_scale = learned_scale
        if learned_scale:
            self.isotropic_scale = nn.Parameter(torch.empty(ctx.depth, h))
        else:
            self.register_buffer("isotropic_scale", torch.empty(ctx.depth, h))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        d, bound = self.ctx.dim, math.sqrt(1 / self.ctx.ndim)
        nn.init.uniform_(self.curvature_proj, -1 / math.sqrt(d), 1 / math.sqrt(d))
        nn.init.uniform_(self.isotropic_scale, -bound, bound)

    def no_weight_decay(self) -> set[str]:
        return {"isotropic_scale"} if self.learned_scale else set()

    @staticmethod
    def num_channels(p: int) -> int:
        return 2 * p

    def key_channels(self, r: torch.Tensor) -> torch.Tensor:
        return torch.cat([r * r, r], dim=-1)

    def layer_state(self, r: torch.Tensor, padding: int) -> dict[str, torch.Tensor]:
        """With sp = softplus(c . x) (a = -sp), the query channels are ``sp * coefficients``."""
        w2 = self.isotropic_scale.to(r.dtype) ** 2  # (L, H)
        bracket = F.pad(torch.cat([torch.ones_like(r), -2 * r], dim=-1), (0, padding))  # (B', T, 2p + pad)
        return dict(coefficients=-w2[:, None, :, None, None] * bracket[None, :, None])  # (L, B', H, T, 2p + pad)

    def curvature(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """a_i w^2 per head: (B, H, T)."""
        a = -F.softplus(torch.einsum("btd,hd->bht", x, self.curvature_proj[layer].to(x.dtype)))  # (B, H, T)
        return a * self.isotropic_scale[layer].to(x.dtype)[:, None] ** 2

    def query_channels(self, layer: int, x: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        sp = F.softplus(F.linear(x, self.curvature_proj[layer].to(x.dtype)))  # (B, T, H)
        return sp.transpose(1, 2)[..., None] * state["coefficients"][layer].to(sp.dtype)  # (B, H, T, 2p + pad)

    def pairwise_scores(self, layer: int, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor,
                        pos: TokenPositions) -> torch.Tensor:
        """a_i w^2 ||r_j - r_i||^2 + q.k, (B, H, T, T), for tests."""
        r = self.token_positions(pos).to(x.dtype)
        dist2 = ((r[None, :, :] - r[:, None, :]) ** 2).sum(-1)
        return self.curvature(layer, x)[..., None] * dist2 + q @ k.transpose(-1, -2)
