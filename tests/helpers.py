"""Shared test utilities: float64 encodings on random inputs and the attention they induce."""

from __future__ import annotations

import math

import torch

from pape_hub.encodings import EncodingContext, PositionEncoding, TokenPositions, create_encoding

DIM, HEADS, DEPTH = 32, 2, 2
HEAD_DIM = DIM // HEADS


def make_encoding(name: str, grid: tuple[int, ...] = (4, 5), num_prefix: int = 1, **kwargs) -> PositionEncoding:
    ctx = EncodingContext(DIM, HEADS, DEPTH, grid, num_prefix)
    torch.manual_seed(0)
    return create_encoding(name, ctx, **kwargs).double()


def random_coords(n: int, p: int = 2, spread: float = 4.0, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, p, generator=g, dtype=torch.float64) * spread


def free_positions(coords: torch.Tensor, num_prefix: int) -> TokenPositions:
    return TokenPositions(coords, num_prefix)


def random_qkx(num_tokens: int, batch: int = 2, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, HEADS, num_tokens, HEAD_DIM, generator=g, dtype=torch.float64)
    k = torch.randn(batch, HEADS, num_tokens, HEAD_DIM, generator=g, dtype=torch.float64)
    x = torch.randn(batch, num_tokens, DIM, generator=g, dtype=torch.float64)
    return q, k, x


def transform(enc: PositionEncoding, layer: int, q, k, x, state) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoding's q/k transform on separate q and k (the hook takes them stacked)."""
    return enc.transform_qk(layer, torch.stack([q, k]), x, state).unbind(0)


def logits(enc: PositionEncoding, pos: TokenPositions, q, k, x, layer: int = 0) -> torch.Tensor:
    """Scaled attention logits (B, H, T, T) exactly as PositionalAttention's eager path forms them."""
    state = enc.prepare(pos)
    q2, k2 = transform(enc, layer, q, k, x, state)
    out = (q2 @ k2.transpose(-1, -2)) * HEAD_DIM**-0.5
    bias = enc.attn_bias(layer, q2, k2, state)
    return out if bias is None else out + bias


def attention(enc: PositionEncoding, pos: TokenPositions, q, k, x, layer: int = 0) -> torch.Tensor:
    return logits(enc, pos, q, k, x, layer).softmax(-1)


def rotation_2d(angle: float) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, -s], [s, c]], dtype=torch.float64)


def naflex_batch(images: list[torch.Tensor], extra: int = 3) -> dict[str, torch.Tensor]:
    """timm's own patchify, padded to the longest (+ ``extra``) as its collator pads: zeros, coordinate 0, invalid."""
    from timm.data.naflex_transforms import patchify_image

    parts = [patchify_image(image, (4, 4))[:2] for image in images]
    length = max(len(p) for p, _ in parts) + extra
    patches = torch.zeros(len(parts), length, parts[0][0].shape[-1], dtype=torch.float64)
    coord = torch.zeros(len(parts), length, 2, dtype=torch.long)
    valid = torch.zeros(len(parts), length, dtype=torch.bool)
    for i, (p, c) in enumerate(parts):
        patches[i, : len(p)], coord[i, : len(p)], valid[i, : len(p)] = p, c, True
    return dict(patches=patches, patch_coord=coord, patch_valid=valid)
