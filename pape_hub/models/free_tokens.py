"""Transformers over tokens at free coordinates: the ViT core (:class:`~pape_hub.models.vit.VisionTransformer`:
encoding, blocks, pooling, head) behind a stem that makes tokens *and* their positions from a set of elements.

A stem maps ``(x, valid)`` to tokens (B, M, D), their coordinates (B, M, 3) in position units and which tokens are
real (B, M). The encoding then sees each token's own coordinates (:class:`~pape_hub.encodings.TokenPositions` in
its per-token form), attention masks padding and pooling skips it, as for NaFlex images. Point clouds
(:mod:`.pointvit`) and event streams (:mod:`.eventvit`) are such models; only their stems differ.

Encodings that need whole grid cells (learned tables, SaPE²'s counts along rows) or are defined in 2-D only are
refused by name at construction (:func:`~pape_hub.encodings.registry.free_coordinates_problem`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..encodings.base import TokenPositions, compute_dtype
from ..encodings.registry import free_coordinates_problem, list_encodings
from .vit import VisionTransformer, feature_take_indices

__all__ = ["FreeTokenTransformer", "free_coordinate_encodings"]


def _plain(value: Any) -> bool:
    """Whether a constructor argument can be written to a checkpoint's JSON (not a class or function)."""
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return value is None or isinstance(value, (bool, int, float, str))


def free_coordinate_encodings(ndim: int = 3) -> list[str]:
    """The encodings that take tokens at free ``ndim``-D coordinates, in ``list_encodings()`` order."""
    return [name for name in list_encodings() if free_coordinates_problem(name, ndim) is None]


class FreeTokenTransformer(VisionTransformer):
    """The ViT core over a stem's tokens at free 3-D coordinates; ``stem(in_chans=, embed_dim=)`` builds the stem,
    the other arguments are :class:`VisionTransformer`'s (without the image ones)."""

    #: what the stem's input is called in messages
    input_name = "elements"

    def __init__(self, stem: Callable[..., nn.Module], position_encoding: str = "pape", in_chans: int = 3,
                 **kwargs: Any) -> None:
        for image_only in ("img_size", "patch_size", "embed_layer", "dynamic_img_size"):
            if image_only in kwargs:
                raise TypeError(f"{type(self).__name__} takes no {image_only}: its stem makes the tokens")
        if kwargs.get("position_interpolation"):
            raise ValueError("position_interpolation rescales an image grid; tokens at free coordinates have none")
        problem = free_coordinates_problem(position_encoding, 3)
        if problem is not None:
            raise ValueError(f"{type(self).__name__} places tokens at free 3-D coordinates, so position encoding "
                             f"{position_encoding!r} cannot take part: {problem}. Encodings that can: "
                             f"{', '.join(free_coordinate_encodings())}")

        def embed_layer(in_chans: int, embed_dim: int, **_: Any) -> nn.Module:  # the ViT core's stem slot
            return stem(in_chans=in_chans, embed_dim=embed_dim)

        super().__init__(img_size=1, patch_size=1, in_chans=in_chans, position_encoding=position_encoding,
                         embed_layer=embed_layer, **kwargs)
        # the constructor arguments a checkpoint records (timm's model_args): what was given, with the sizes as built
        given = {k: v for k, v in kwargs.items() if k != "num_classes" and _plain(v)}
        self.model_args: dict[str, Any] = dict(
            given, position_encoding=position_encoding, in_chans=in_chans, embed_dim=self.embed_dim,
            depth=len(self.blocks), num_heads=self.blocks[0].attn.num_heads if len(self.blocks) else 1)

    # --- what an image model has and this one has not --------------------------------------------
    def set_input_size(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no input size: any number of {self.input_name} runs")

    def get_patch_size(self) -> tuple[int, ...]:
        raise NotImplementedError(f"{type(self).__name__} makes tokens from {self.input_name}, not patches")

    # --- forward ---------------------------------------------------------------------------------
    def embed_free(self, x: torch.Tensor, valid: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, TokenPositions]:
        """Elements (B, N, C) and their validity (B, N) -> tokens (B, P+N', D) and their positions (with the tokens'
        own validity)."""
        tokens, coords, token_valid = self.patch_embed(x, valid)
        pos = TokenPositions(coords.to(compute_dtype(tokens)), self.num_prefix_tokens, valid=token_valid)
        return self.with_prefix_and_positions(tokens, pos), pos

    def forward_features(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Final normed tokens (B, P+M, D). A padded sample's output has padding tokens too: :meth:`forward` pools
        without them; to pool these yourself, take the tokens' validity from ``patch_embed(x, valid)[2]``."""
        x, pos = self.embed_free(x, valid)
        x, _, _ = self.run_blocks(x, pos)
        return self.norm(x)

    def forward(self, x: torch.Tensor | dict[str, torch.Tensor], valid: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, classes) of elements (B, N, C), padding marked False in ``valid`` (B, N); or of a collated
        batch ``{"x": ..., "valid": ...}`` (:func:`~pape_hub.data.point_clouds.pad_collate`), as a training loop
        passes it."""
        if isinstance(x, dict):
            if "x" not in x:
                raise ValueError(f"a batch dict holds 'x' (and 'valid'), got keys {sorted(x)}")
            x, valid = x["x"], x.get("valid", valid)
        x, pos = self.embed_free(x, valid)
        x, _, _ = self.run_blocks(x, pos)
        return self.forward_head(self.norm(x), patch_valid=pos.valid)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NLC",
        intermediates_only: bool = False,
        valid: torch.Tensor | None = None,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's feature API: the tokens (B, M, D) after the blocks in ``indices``, ``"NLC"`` only (tokens at free
        coordinates have no map to reshape to)."""
        if output_fmt != "NLC":
            raise ValueError(f'tokens at free coordinates have no grid to reshape to: use output_fmt="NLC", got '
                             f"{output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        tokens, pos = self.embed_free(x, valid)
        tokens, hidden, _ = self.run_blocks(tokens, pos, take=set(take_indices),
                                            stop_after=max_index if stop_early else None)
        hidden = [self.norm(h) if norm else h for h in hidden]
        p = self.num_prefix_tokens
        hidden = [(h[:, p:], h[:, :p]) if return_prefix_tokens else h[:, p:] for h in hidden]
        return hidden if intermediates_only else (self.norm(tokens), hidden)
