"""Native-resolution inputs: patches with per-token coordinates, as timm's NaFlexViT and transformers' SigLIP2 take
them, for every encoding.

A batch of images of different shapes is patchified (``timm.data.naflex_transforms.patchify_image``; each patch
flattened channels-last, P x P x C, the layout SigLIP2's processor writes too), padded to one length and given per
token: ``patch_coord`` (B, N, 2) as (y, x) patch indices, ``patch_valid`` (B, N) (False for padding) and, for a packed
row of several images, ``segment_ids`` (B, N). The model embeds the patches with its own patch convolution (as a
linear map: the same numbers), hands the encoding each token's coordinate (:class:`TokenPositions` in its per-token
form), masks padding and other images in attention, and pools over each image's valid tokens only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..encodings.base import TokenPositions

__all__ = ["NaFlexInput", "embed_patches", "masked_pool", "naflex_input", "per_token_positions"]


class NaFlexInput(NamedTuple):
    """A per-token batch: patches (B, N, P*P*C), coordinates (B, N, 2) as (y, x), validity (B, N) and the image of
    each token in a packed row (B, N), the last two None where every token is valid / each row is one image."""

    patches: torch.Tensor
    coord: torch.Tensor
    valid: torch.Tensor | None
    segments: torch.Tensor | None


def naflex_input(x: Any, patch_coord: torch.Tensor | None = None, patch_valid: torch.Tensor | None = None,
                 segment_ids: torch.Tensor | None = None) -> NaFlexInput | None:
    """The per-token batch in ``x`` (timm's NaFlex collator dict: ``patches``, ``patch_coord``, ``patch_valid``,
    optionally ``segment_ids``; or pre-patchified ``[B, N, P*P*C]`` with ``patch_coord``), checked; None for an
    image batch ``[B, C, H, W]`` without coordinates."""
    if isinstance(x, dict):
        if "patches" not in x or "patch_coord" not in x:
            raise ValueError(f"a NaFlex batch is a dict with 'patches' and 'patch_coord' (timm's collator), got keys "
                             f"{sorted(x)}")
        batch = x
        x, patch_coord = batch["patches"], batch["patch_coord"]
        patch_valid, segment_ids = x_get(batch, "patch_valid", patch_valid), x_get(batch, "segment_ids", segment_ids)
    if patch_coord is None:
        if patch_valid is not None or segment_ids is not None:
            raise ValueError("patch_valid / segment_ids describe per-token inputs: pass patch_coord (B, N, 2) too")
        return None
    if x.ndim != 3:
        raise ValueError(f"per-token inputs are patches [B, N, P*P*C] (timm's patchify_image, channels last), got "
                         f"shape {tuple(x.shape)}")
    B, N = x.shape[:2]
    if tuple(patch_coord.shape) != (B, N, 2):
        raise ValueError(f"patch_coord must be [B, N, 2] = {[B, N, 2]} as (y, x) patch indices, got "
                         f"{list(patch_coord.shape)}")
    for name, t in (("patch_valid", patch_valid), ("segment_ids", segment_ids)):
        if t is not None and tuple(t.shape) != (B, N):
            raise ValueError(f"{name} must be [B, N] = {[B, N]}, got {list(t.shape)}")
    valid = patch_valid.bool() if patch_valid is not None else None
    return NaFlexInput(x, patch_coord, valid, segment_ids.long() if segment_ids is not None else None)


def x_get(batch: dict, key: str, default: Any) -> Any:
    """A collator dict's entry, the argument where the dict has none."""
    value = batch.get(key)
    return default if value is None else value


def embed_patches(proj: nn.Conv2d, patches: torch.Tensor) -> torch.Tensor:
    """Patches (B, N, P*P*C), each flattened channels-last, -> tokens (B, N, D) with the patch convolution's own
    weights used as a linear map: exactly the convolution of that patch of the image."""
    out_dim, channels, ph, pw = proj.weight.shape
    if patches.shape[-1] != ph * pw * channels:
        raise ValueError(f"patches of {patches.shape[-1]} values do not fit the model's {ph}x{pw} patches of "
                         f"{channels} channels ({ph * pw * channels} values, flattened P x P x C)")
    weight = proj.weight.permute(0, 2, 3, 1).reshape(out_dim, -1)  # (D, Ph * Pw * C): channels fastest
    return F.linear(patches.to(weight.dtype), weight, proj.bias)


def per_token_positions(inp: NaFlexInput, num_prefix_tokens: int, dtype: torch.dtype) -> TokenPositions:
    """The batch's positions in the encodings' terms: (x, y) coordinates (timm's patch_coord is (y, x)) per token."""
    coords = inp.coord.flip(-1).to(dtype)  # (B, N, 2) as (x, y)
    return TokenPositions(coords, num_prefix_tokens, valid=inp.valid, segments=inp.segments)


def masked_pool(x: torch.Tensor, pool_type: str, num_prefix_tokens: int, valid: torch.Tensor | None,
                segments: torch.Tensor | None = None) -> torch.Tensor:
    """timm's pooling over the valid patch tokens only: (B, P+N, D) -> (B, D); a packed row -> (B, S, D), one row per
    image (``segments`` 0 .. S-1; a row with fewer images has zero rows after them). Token pooling takes the first
    prefix token (CLS)."""
    if pool_type == "token":
        if segments is not None:
            raise ValueError("a packed row has one CLS for all its images: pool packed rows with global_pool='avg'")
        return x[:, 0]
    patches = x[:, num_prefix_tokens:]  # (B, N, D)
    keep = valid if valid is not None else torch.ones(patches.shape[:2], dtype=torch.bool, device=x.device)
    if segments is None:
        member = keep[:, None]  # (B, 1, N)
    else:  # (B, S, N): token n is in image s
        count = int(segments.masked_fill(~keep, -1).max()) + 1
        member = (segments[:, None, :] == torch.arange(count, device=x.device)[None, :, None]) & keep[:, None]
    weights = member.to(patches.dtype)
    mean = weights @ patches / weights.sum(-1, keepdim=True).clamp(min=1)  # (B, S, D)
    pooled = {"avg": lambda: mean, "max": lambda: _masked_max(patches, member),
              "avgmax": lambda: 0.5 * (mean + _masked_max(patches, member))}
    if pool_type not in pooled:
        raise ValueError(f"pooling {pool_type!r} over per-token inputs: use 'avg', 'max', 'avgmax' or 'token'")
    out = pooled[pool_type]()
    return out if segments is not None else out[:, 0]


def _masked_max(patches: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    """(B, N, D), (B, S, N) -> (B, S, D): the largest value over each set's tokens."""
    low = torch.finfo(patches.dtype).min
    return patches[:, None].masked_fill(~member[..., None], low).amax(2)
