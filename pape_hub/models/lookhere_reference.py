"""LookHere's released ViT, re-implemented on its own: what a conversion of the official ``.pth`` is checked against.

LookHere's code (GreenCUBIC/lookhere, commit 641deab) is no package, so neither ``pape-hub convert`` nor the tests can
build the source with its own code. This module is the stand-in: a small forward written from that code's documented
behaviour (``docs/pretrained.md``, "Source conventions"), not from this package's
:class:`~pape_hub.encodings.LookHere`. It keeps the official conventions where the package differs, so a conversion
must bridge them: heads in the official order (corners top-left, top-right, bottom-left, bottom-right), views tested
as the official code tests them (rows and columns for halves and corners, the two diagonals through the query for
triangles), the official slope rules, the bias built in float64 as ``global * layer * head * distance``, out-of-view
entries set to bfloat16's largest value, the whole bias rounded to bfloat16 and negated. Module names are the
official ones, so :meth:`LookHereReference.load_state_dict` takes a release file's ``weights`` unchanged.

The release file is ``{"config": {...}, "weights": state_dict}`` (``torch.load`` with ``weights_only=True`` reads it).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LookHereReference", "official_bias", "official_heads"]

#: the official direction groups: one entry per head of a group of four, each the directions it looks in (a key
#: outside any of them is out of view); ``none`` heads look everywhere
_GROUPS: dict[str, list[tuple[str, ...]]] = {
    "corners": [("up", "left"), ("up", "right"), ("down", "left"), ("down", "right")],
    "triangles": [("tri_up",), ("tri_down",), ("tri_left",), ("tri_right",)],
    "halves": [("up",), ("down",), ("left",), ("right",)],
    "none": [(), (), (), ()],
}
#: heads per group, as the official code hard-codes them: (groups, heads) -> sizes
_SPLITS = {(2, 12): (8, 4), (3, 12): (4, 4, 4), (2, 16): (8, 8), (3, 16): (8, 4, 4), (4, 16): (4, 4, 4, 4)}
_NONE_SLOPES = (1 / 4, 1 / 16, 1 / 64, 1 / 256)


def _group_slopes(group: str, count: int) -> list[float]:
    """Directional groups: 2^-1 for the first four heads, 2^-2 for the next four, ...; ``none`` groups: 1/4, 1/16,
    1/64, 1/256, each repeated count/4 times (the first two for two heads)."""
    if group != "none":
        return [2.0 ** -(1 + i // 4) for i in range(count)]
    if count <= 4:
        return list(_NONE_SLOPES[:count])
    return [s for s in _NONE_SLOPES for _ in range(count // 4)]


def official_heads(head_directions: str, num_heads: int) -> list[tuple[tuple[str, ...], float]]:
    """(directions, head slope) of every head, in the official order."""
    groups = head_directions.split("-")
    if any(g not in _GROUPS for g in groups):
        raise ValueError(f"head directions {head_directions!r}: this reference knows only {sorted(_GROUPS)}")
    sizes = (num_heads,) if len(groups) == 1 else _SPLITS.get((len(groups), num_heads))
    if sizes is None:
        raise ValueError(f"the official code has no split of {num_heads} heads into {len(groups)} groups")
    heads = []
    for group, count in zip(groups, sizes):
        directions = [_GROUPS[group][i % 4] for i in range(count)]
        heads += list(zip(directions, _group_slopes(group, count)))
    return heads


def _visible(direction: str, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(N, N) True where key k (x, y) lies in ``direction`` seen from query q; y grows downwards."""
    (qx, qy), (kx, ky) = (q[:, None, 0], q[:, None, 1]), (k[None, :, 0], k[None, :, 1])
    by_line = {
        "up": ky <= qy, "down": ky >= qy, "left": kx <= qx, "right": kx >= qx,
        # a 90-degree wedge between the two diagonals through the query (kx - ky and kx + ky constant on them)
        "tri_up": (kx - ky >= qx - qy) & (kx + ky <= qx + qy),
        "tri_down": (kx - ky <= qx - qy) & (kx + ky >= qx + qy),
        "tri_left": (kx - ky <= qx - qy) & (kx + ky <= qx + qy),
        "tri_right": (kx - ky >= qx - qy) & (kx + ky >= qx + qy),
    }
    return by_line[direction]


def official_bias(config: dict[str, Any], grid: tuple[int, int], depth: int, num_heads: int) -> torch.Tensor:
    """(depth, heads, 1 + N, 1 + N) float64 holding bfloat16 values: the release's attention bias, CLS first."""
    if config.get("distance", "linear") != "linear" or config.get("fill_with", "inf") != "inf":
        raise ValueError("this reference builds the released configuration only (linear distance, +inf fill)")
    rows, cols = grid
    ys, xs = torch.meshgrid(torch.arange(rows, dtype=torch.float64), torch.arange(cols, dtype=torch.float64),
                            indexing="ij")
    coords = torch.stack([xs.flatten(), ys.flatten()], dim=-1)  # (N, 2), row-major tokens
    dist = torch.cdist(coords, coords)
    heads = []
    for directions, slope in official_heads(config["head_directions"], num_heads):
        in_view = torch.ones_like(dist, dtype=torch.bool)
        for direction in directions:  # each direction masks what lies outside it
            in_view &= _visible(direction, coords, coords)
        heads.append(slope * dist.masked_fill(~in_view, math.inf))
    start, stop = config["layer_slopes"]
    layer_slopes = torch.linspace(start, stop, depth, dtype=torch.float64)  # numpy's linspace in the original
    bias = config["global_slope"] * layer_slopes[:, None, None, None] * torch.stack(heads)[None]
    bias = bias.nan_to_num(posinf=torch.finfo(torch.bfloat16).max).to(torch.float32).to(torch.bfloat16)
    return F.pad(-bias.to(torch.float64), (1, 0, 1, 0))  # CLS: zero row and column


class _Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, D // self.num_heads).permute(2, 0, 3, 1, 4)
        logits = q @ k.transpose(-2, -1) * (D // self.num_heads) ** -0.5 + bias.to(x.dtype)
        return self.proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(B, N, D))


class _Scale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), 1e-4))


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, out: int, act: nn.Module) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), act, nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _Block(nn.Module):
    """DeiT-III's block: ``nn.LayerNorm`` (eps 1e-5), LayerScale on both branches."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.norm1, self.attn, self.ls1 = nn.LayerNorm(dim), _Attention(dim, num_heads), _Scale(dim)
        self.norm2, self.mlp, self.ls2 = nn.LayerNorm(dim), _Mlp(dim, 4 * dim, dim, nn.GELU()), _Scale(dim)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1.gamma * self.attn(self.norm1(x), bias)
        return x + self.ls2.gamma * self.mlp(self.norm2(x))


class LookHereReference(nn.Module):
    """The released model: patches, CLS (no position table), blocks with the bias above, final norm, and the
    pre-logits head ``fc1 -> tanh -> fc2`` on the CLS token. Any input size: the bias is built for its grid."""

    def __init__(self, config: dict[str, Any], embed_dim: int = 768, depth: int = 12, num_heads: int = 12,
                 patch_size: int = 16, num_classes: int = 1000, in_chans: int = 3) -> None:
        super().__init__()
        self.config, self.num_heads, self.patch_size = dict(config), num_heads, patch_size
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(in_chans, embed_dim, patch_size, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.blocks = nn.ModuleList(_Block(embed_dim, num_heads) for _ in range(depth))
        self.norm = nn.LayerNorm(embed_dim)
        self.head = _Mlp(embed_dim, 4 * embed_dim, num_classes, nn.Tanh())

    @classmethod
    def from_release(cls, release: dict[str, Any], num_heads: int = 12) -> LookHereReference:
        """The model of a release file's ``{"config", "weights"}``, its sizes read from the weights (the head count
        is not in them: the releases have 12)."""
        weights = release["weights"]
        embed_dim, in_chans, patch_size, _ = weights["patch_embed.proj.weight"].shape
        depth = 1 + max(int(k.split(".")[1]) for k in weights if k.startswith("blocks."))
        model = cls(release["config"], embed_dim, depth, num_heads, patch_size, weights["head.fc2.weight"].shape[0],
                    in_chans).to(weights["patch_embed.proj.weight"].dtype)
        model.load_state_dict(weights)
        return model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grid = (x.shape[-2] // self.patch_size, x.shape[-1] // self.patch_size)
        bias = official_bias(self.config, grid, len(self.blocks), self.num_heads).to(x.device)
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2)  # (B, D, h, w) -> (B, N, D)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        for block, layer_bias in zip(self.blocks, bias):
            x = block(x, layer_bias)
        return self.head(self.norm(x)[:, 0])
