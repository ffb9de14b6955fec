"""SaPE^2 (arXiv 2505.09466): semantic-aware 2-D positions, CoPE-style, as an additive logit bias.

Per layer, head and axis (eqs. 9-16; reference code in the paper's appendix D):

1. gates within each row (x axis) or column (y axis): g_ij = sigmoid(q_i . k_j / sqrt(d));
2. contextual positions: p_im = sum of g_ij over the keys j of the same row at or after column m
   (a reverse cumulative sum), clamped to [0, npos - 1];
3. position logits z_i[p] = u_i . e[p] for integer p (key mode: u = k, the paper's best; query mode: u = q),
   linearly interpolated at the fractional p_im, giving the vector SaPE_x[i] = (z_i1, ..., z_iW);
4. bias_in = ||SaPE_x[i] - SaPE_x[n]||_2 + ||SaPE_y[i] - SaPE_y[n]||_2, added to q.k before the sqrt(d)
   division (eq. 16).

The bias depends on content, so it is a (B, heads, N, N) tensor built every forward (not fused, like the
method itself). npos defaults to the longest training-grid side + 1 (positions lie in [0, W]); larger
grids clamp, as the reference does. The paper's code takes H == W; here rows and columns may differ.
Video (this project's extension; the paper is 2-D): time is a third axis treated like the other two - gates and
contextual positions along each temporal line, its own position-logit table, and a third distance term.
The paper has no class token in this path: CLS gets a zero bias row and column and takes no part in gates.
``sape2_ape`` adds a learned absolute embedding (the paper's SaPE^2 + APE).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from timm.layers import trunc_normal_
from torch import nn

from .absolute import AddsLearnedTable
from .base import EncodingContext, PositionEncoding, TokenPositions, pad_prefix_bias
from .registry import register_encoding

__all__ = ["SaPE2"]


def contextual_position_logits(
    q: torch.Tensor, k: torch.Tensor, emb: torch.Tensor, scale: float, key_mode: bool
) -> torch.Tensor:
    """One axis of SaPE^2 along the second-to-last token axis.

    q, k: (..., L, d) tokens of one line (row or column); emb: (d, npos). Returns (..., L, L): for query i,
    the interpolated logit of every position m in its line.
    """
    gates = torch.sigmoid((q @ k.transpose(-1, -2)) * scale)  # (..., L_i, L_j)
    pos = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=emb.shape[-1] - 1)  # p_im = sum_{j >= m} g_ij
    logits = (k if key_mode else q) @ emb  # (..., L, npos): z_i[p] at integer p
    # indices from a NaN-free copy: a NaN input then stays NaN in its own sample (through frac), as it does in every
    # other encoding, instead of becoming an out-of-range index that fails the whole batch
    index = pos.detach().nan_to_num(0.0)
    floor = index.floor()
    frac = pos - floor
    lower = logits.gather(-1, floor.long())
    upper = logits.gather(-1, index.ceil().long())
    return upper * frac + lower * (1 - frac)


def pairwise_l2(x: torch.Tensor) -> torch.Tensor:
    """(..., N, L) -> (..., N, N) Euclidean distances; in float32 for 16-bit inputs on CPU, where ``cdist`` has no
    half-precision kernel."""
    if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16):
        return torch.cdist(x.float(), x.float()).to(x.dtype)
    return torch.cdist(x, x)


@register_encoding("sape2_ape", with_ape=True)
@register_encoding("sape2")
class SaPE2(AddsLearnedTable, PositionEncoding):
    """SaPE^2 (key mode by default), optionally with a learned absolute embedding; ``table_std`` is the std of the
    position-logit tables' init (default 0.02, the paper's)."""

    mechanisms = ("bias",)
    fused = False
    supported_ndims = (2, 3)
    paper = "SaPE^2 (2025), key mode"

    def __init__(self, ctx: EncodingContext, mode: str = "key", num_positions: int | None = None,
                 with_ape: bool = False, table_std: float = 0.02) -> None:
        super().__init__(ctx)
        if not (math.isfinite(table_std) and table_std > 0):
            raise ValueError(f"SaPE2 table_std must be a positive number, got {table_std!r}")
        self.table_std = table_std
        if mode not in ("key", "query"):
            raise ValueError(f"SaPE2 mode must be 'key' or 'query', got {mode!r}")
        self.key_mode = mode == "key"
        self.num_positions = num_positions or max(ctx.grid_size) + 1
        # (depth, axis x/y(/t), head_dim, npos), shared by the heads of a layer as in the reference
        self.pos_emb = nn.Parameter(torch.zeros(ctx.depth, ctx.ndim, ctx.head_dim, self.num_positions))
        self.reset_parameters()
        self.add_learned_table(ctx, with_ape)

    def reset_parameters(self) -> None:
        """The position-logit tables: truncated normal (cut at +-2, as the reference's ``trunc_normal_``), std
        ``table_std``. The default 0.02 is the paper's appendix; on small grids it leaves the gates, SaPE²'s only
        positional pathway, with almost no signal or gradient at the start (the README measures what a larger std
        changes)."""
        trunc_normal_(self.pos_emb, std=self.table_std)

    def no_weight_decay(self) -> set[str]:
        """The position-logit tables (and APE's table) are position parameters: no weight decay."""
        return {"pos_emb"} | self.table_no_weight_decay()

    def prepare(self, pos: TokenPositions) -> tuple[int, ...]:
        return self.require_grid(pos, "sape2")

    def attn_bias(self, layer: int, q: torch.Tensor, k: torch.Tensor, state: Any) -> torch.Tensor:
        grid = tuple(state)  # (rows, cols) or (T, rows, cols)
        p, scale, nd = self.ctx.num_prefix_tokens, self.ctx.head_dim**-0.5, len(grid)
        emb = self.pos_emb[layer].to(q.dtype)
        q_grid = q[:, :, p:].unflatten(2, grid)  # (B, H, *grid, d)
        k_grid = k[:, :, p:].unflatten(2, grid)
        bias = None
        for coord_axis in range(nd):  # x (along rows), y (along columns), t: coordinate order
            axis = 2 + nd - 1 - coord_axis  # its dimension in (B, H, *grid, d)
            last = 1 + nd  # the grid dimension next to d
            along = contextual_position_logits(q_grid.movedim(axis, last), k_grid.movedim(axis, last),
                                               emb[coord_axis], scale, self.key_mode)  # (B, H, *others, L, L)
            sape = along.movedim(-2, axis).flatten(2, 1 + nd)  # (B, H, N, L): query order restored
            distance = pairwise_l2(sape)  # (B, H, N, N)
            bias = distance if bias is None else bias + distance
        return pad_prefix_bias(bias * scale, p)  # eq. 16 divides the bias by sqrt(d) too
