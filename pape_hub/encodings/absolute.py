"""Absolute encodings, added to the tokens: none (NoPE), learned (APE) and nD sin-cos."""

from __future__ import annotations

import torch
from timm.layers import is_exporting, resample_abs_pos_embed, trunc_normal_
from torch import nn

from .base import EncodingContext, PositionEncoding, TokenPositions, cell_index
from .registry import register_encoding

__all__ = ["AddsLearnedTable", "LearnedAbsolute", "NoPosition", "SinCos", "resample_table", "sincos_embedding"]


def resample_table(table: torch.Tensor, new_grid: tuple[int, ...], old_grid: tuple[int, ...], num_prefix: int
                   ) -> torch.Tensor:
    """A learned (1, P + N, D) table at ``old_grid`` -> the same at ``new_grid``; prefix rows are kept as they are.

    2-D: timm's bicubic ``resample_abs_pos_embed``. 3-D: trilinear over (t, h, w) (torch has no tricubic mode).
    """
    if not is_exporting() and tuple(new_grid) == tuple(old_grid):  # exporting: no branch on the (symbolic) grid
        return table
    if len(old_grid) == 2:
        return resample_abs_pos_embed(table, new_size=list(new_grid), old_size=list(old_grid),
                                      num_prefix_tokens=num_prefix)
    prefix, cells = table[:, :num_prefix], table[:, num_prefix:]
    volume = cells.float().reshape(1, *old_grid, -1).movedim(-1, 1)  # (1, D, T, H, W)
    volume = nn.functional.interpolate(volume, size=tuple(new_grid), mode="trilinear", align_corners=False)
    return torch.cat([prefix, volume.movedim(1, -1).flatten(1, -2).to(table.dtype)], dim=1)


@register_encoding("none")
class NoPosition(PositionEncoding):
    """No position information at all (NoPE): attention is permutation invariant."""

    mechanisms = ()
    paper = "-"


@register_encoding("ape")
class LearnedAbsolute(PositionEncoding):
    """Learned absolute embedding (ViT/DeiT), one vector per training-grid cell and per prefix token.

    Other grids resample the table: bicubically for images (timm's ``resample_abs_pos_embed``), trilinearly over
    (t, h, w) for video (:func:`resample_table`). This is always an interpolation, so the ``position interpolation``
    option changes nothing for APE. CLS has its own learned slot, as in timm's ViT; with ``prefix_slots=False`` the
    table holds the patch cells only and prefix tokens get nothing (timm's ``no_embed_class``, e.g. Naver's
    RoPE + APE models).
    """

    mechanisms = ("tokens",)
    supported_ndims = (2, 3)
    grid_cells = True
    paper = "ViT (Dosovitskiy et al. 2020)"

    def __init__(self, ctx: EncodingContext, init_std: float = 0.02, prefix_slots: bool = True) -> None:
        super().__init__(ctx)
        num_patches = 1
        for n in ctx.grid_size:
            num_patches *= n
        self.init_std = init_std
        self.table_prefix = ctx.num_prefix_tokens if prefix_slots else 0  # prefix rows the table holds
        self.pos_embed = nn.Parameter(torch.zeros(1, self.table_prefix + num_patches, ctx.dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        trunc_normal_(self.pos_embed, std=self.init_std)

    def add_to_tokens(self, x: torch.Tensor, pos: TokenPositions) -> torch.Tensor:
        if pos.per_sample:
            return x + self.per_token_table(pos).to(x.dtype)
        grid = self.require_grid(pos, "ape")
        table = resample_table(self.pos_embed, grid, self.ctx.grid_size, self.table_prefix)
        if self.table_prefix != self.ctx.num_prefix_tokens:  # (1, N, D) -> (1, P+N, D): zero rows for the prefix
            table = nn.functional.pad(table, (0, 0, self.ctx.num_prefix_tokens - self.table_prefix, 0))
        return x + table.to(x.dtype)

    def per_token_table(self, pos: TokenPositions) -> torch.Tensor:
        """(B, P+N, D): each token's row of the table resampled to its sample's grid (the highest patch index + 1
        per axis), read at the token's cell, as timm's NaFlexEmbeds does (one resampling per distinct grid size);
        prefix tokens their own rows. The table is a grid of cells, so coordinates must be whole patch indices."""
        index = pos.coords / pos.axis_scale
        cells = index.round()
        valid = pos.valid if pos.valid is not None else torch.ones(index.shape[:2], dtype=torch.bool,
                                                                   device=index.device)
        if ((index - cells).abs() > 1e-4)[valid].any() or (cells < 0)[valid].any():
            raise ValueError(f"{self.name or 'ape'} reads a learned table of grid cells, so per-token coordinates must "
                             "be whole, non-negative patch indices (timm's patch_coord); free coordinates fall "
                             "between its cells")
        cells = cells.long().masked_fill(~valid[..., None], 0)  # (B, N, p), coordinate order
        sizes = pos.sample_grid_sizes()  # (B, N, p): each token's image's grid, coordinate order
        x_rows = self.pos_embed.new_zeros(cells.shape[0], cells.shape[1], self.ctx.dim)
        for size in torch.unique(sizes[valid], dim=0):  # one resampling per distinct grid size
            grid = tuple(int(v) for v in size.flip(0))  # grid order (H, W) / (T, H, W)
            table = resample_table(self.pos_embed, grid, self.ctx.grid_size, self.table_prefix)
            rows = table[0, self.table_prefix:]  # (prod(grid), D), row-major
            flat = cell_index(cells, grid[::-1]).clamp(max=rows.shape[0] - 1)  # (B, N)
            mine = (sizes == size).all(-1)  # (B, N) the tokens of images of this size
            x_rows = torch.where(mine[..., None], rows[flat], x_rows)
        out = x_rows.masked_fill(~valid[..., None], 0.0)  # padding gets nothing
        prefix = self.pos_embed[:, : self.table_prefix].expand(out.shape[0], -1, -1)
        missing = self.ctx.num_prefix_tokens - self.table_prefix  # prefix tokens without a row of their own: zeros
        return torch.cat([prefix, out.new_zeros(out.shape[0], missing, out.shape[-1]), out], dim=1)

    def set_grid_size(self, grid_size: tuple[int, ...], old_grid_size: tuple[int, ...]) -> None:
        resampled = resample_table(self.pos_embed.data, grid_size, old_grid_size, self.table_prefix)
        self.pos_embed = nn.Parameter(resampled, requires_grad=self.pos_embed.requires_grad)
        super().set_grid_size(grid_size, old_grid_size)

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed"}


class AddsLearnedTable:
    """Mixin of an encoding that can also add a learned absolute table to the tokens (``with_ape``): the table is
    the child encoding ``absolute`` (state-dict key ``absolute.pos_embed``), listed first among the mechanisms."""

    absolute: LearnedAbsolute | None
    mechanisms: tuple[str, ...]

    def add_learned_table(self, ctx: EncodingContext, with_ape: bool, prefix_slots: bool = True) -> None:
        self.absolute = LearnedAbsolute(ctx, prefix_slots=prefix_slots) if with_ape else None
        if with_ape:
            self.mechanisms = ("tokens", *type(self).mechanisms)

    def add_to_tokens(self, x: torch.Tensor, pos: TokenPositions) -> torch.Tensor:
        return self.absolute.add_to_tokens(x, pos) if self.absolute is not None else x

    def table_no_weight_decay(self) -> set[str]:
        """The table is a position parameter: no weight decay."""
        return {"absolute.pos_embed"} if self.absolute is not None else set()


def sincos_embedding(coords: torch.Tensor, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """nD sin-cos of ``coords`` (..., N, p) -> (..., N, dim), in float32.

    MAE's convention: ``dim // (2p)`` frequencies ``1 / T^(k / F)`` per axis, each axis laid out
    ``[sin | cos]``, axes in coordinate order ``[x, y(, t)]``; any remainder of ``dim`` is zero.
    """
    p = coords.shape[-1]
    num_freqs = dim // (2 * p)
    if num_freqs == 0:
        raise ValueError(f"sincos needs embed dim >= {2 * p} for {p}-D positions, got {dim}")
    omega = 1.0 / temperature ** (torch.arange(num_freqs, dtype=torch.float32, device=coords.device) / num_freqs)
    phase = coords.float()[..., None] * omega  # (..., N, p, F)
    emb = torch.cat([phase.sin(), phase.cos()], dim=-1).flatten(-2)  # (..., N, 2 p F): per axis [sin | cos]
    return nn.functional.pad(emb, (0, dim - emb.shape[-1]))


@register_encoding("sincos")
class SinCos(PositionEncoding):
    """Fixed nD sin-cos embedding added to the patch tokens (Wang & Liu 2021; MAE's layout).

    2-D order: the first half of the channels encodes x (column), the second half y (row) - MAE's code
    labels the first half ``emb_h`` but it is x. CLS gets a zero vector. Any grid: the table is computed
    for the coordinates given, so position interpolation scales the coordinates.
    """

    mechanisms = ("tokens",)
    paper = "nD-sincos (Wang & Liu 2021), MAE layout"

    def __init__(self, ctx: EncodingContext, temperature: float = 10000.0) -> None:
        super().__init__(ctx)
        self.temperature = temperature

    def prepare_table(self, pos: TokenPositions) -> torch.Tensor:
        def build() -> torch.Tensor:
            emb = sincos_embedding(pos.coords, self.ctx.dim, self.temperature)  # (N, D) or (B, N, D)
            return nn.functional.pad(emb, (0, 0, pos.num_prefix_tokens, 0))  # CLS rows are zero

        return self.cached(pos.cache_key(), build)

    def add_to_tokens(self, x: torch.Tensor, pos: TokenPositions) -> torch.Tensor:
        return x + self.prepare_table(pos).to(x.dtype)
