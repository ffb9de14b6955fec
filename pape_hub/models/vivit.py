"""ViViT (Arnab et al. 2021; the video model of the PaPE and LieRE papers) with a pluggable position encoding.

The ViT of :mod:`.vit` with a tubelet stem (:class:`~pape_hub.layers.TubeletEmbed`, default 2 x 16 x 16, a 3-D
convolution): tokens sit at (t, y, x) grid positions and every block is the same
:class:`~pape_hub.layers.PositionalAttention` over all tokens (ViViT's spatio-temporal attention, "model 1"), so
every encoding defined in 3-D works unchanged. Time steps are ``temporal_scale`` spatial patches long.

Input: ``(B, C, T, H, W)`` (timm / PyTorch video layout) or ``(B, T, C, H, W)`` (transformers' ViViT layout). The
layout is read from where the channel count is; when both axes 1 and 2 equal it (e.g. 3 frames of RGB) the timm
layout is assumed, and ``input_layout="BTCHW"`` fixes it. Any number of frames and any spatial size that are whole
tubelets run without changing the model.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from timm.layers import register_notrace_function

from ..layers.tubelet import TubeletEmbed
from .vit import VisionTransformer

__all__ = ["VideoVisionTransformer"]

_LAYOUTS = ("auto", "BCTHW", "BTCHW")


class VideoVisionTransformer(VisionTransformer):
    """ViViT; arguments as :class:`~pape_hub.models.vit.VisionTransformer` plus:

    num_frames: nominal clip length (the training grid's time extent; APE's table size).
    tubelet_size: (t, h, w) of one token.
    temporal_scale: length of one tubelet step in time, in spatial patches (PaPE's event-camera setting makes
        time commensurable with space this way); scales the time coordinate every encoding sees.
    input_layout: ``"auto"``, ``"BCTHW"`` or ``"BTCHW"``.
    """

    is_video = True

    def __init__(self, img_size: int | tuple[int, int] = 224, num_frames: int = 16,
                 tubelet_size: tuple[int, int, int] | list[int] = (2, 16, 16), temporal_scale: float = 1.0,
                 input_layout: str = "auto", **kwargs: Any) -> None:
        if "patch_size" in kwargs or "embed_layer" in kwargs:
            raise TypeError("VideoVisionTransformer takes tubelet_size=(t, h, w), not patch_size / embed_layer")
        if input_layout not in _LAYOUTS:
            raise ValueError(f"input_layout must be one of {_LAYOUTS}, got {input_layout!r}")
        if not temporal_scale > 0:
            raise ValueError(f"temporal_scale must be positive, got {temporal_scale}")
        t, h, w = (int(v) for v in tubelet_size)
        super().__init__(img_size=img_size, patch_size=(h, w), **kwargs,
                         embed_layer=partial(TubeletEmbed, num_frames=num_frames, tubelet_frames=t))
        self.temporal_scale = float(temporal_scale)
        self.input_layout = input_layout
        self.num_frames = num_frames

    def axis_units(self) -> tuple[float, ...]:
        return (self.temporal_scale, 1.0, 1.0)  # grid order (t, h, w)

    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, T, H, W) or (B, T, C, H, W) -> (B, C, T, H, W)."""
        return to_bcthw(x, self.patch_embed.proj.in_channels, self.input_layout)

    def tile_size(self) -> tuple[int, int, int]:
        return tuple(self.patch_embed.tubelet_size)

    def native_size(self) -> tuple[int, int, int]:
        return (self.patch_embed.num_frames, *self.patch_embed.img_size)

    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: int | None = None,
                       num_frames: int | None = None) -> None:
        """Change the nominal clip size (what position interpolation refers to; APE's table size)."""
        if patch_size is not None:
            raise NotImplementedError("changing the tubelet size is not supported; create a model with that size")
        old_grid = tuple(self.patch_embed.grid_size)
        self.patch_embed.set_input_size(img_size=img_size, num_frames=num_frames)
        self.num_frames = self.patch_embed.num_frames
        self.pos_encoding.set_grid_size(tuple(self.patch_embed.grid_size), old_grid)


@register_notrace_function  # the layout is read from the shape: an opaque call under torch.fx
def to_bcthw(x: torch.Tensor, channels: int, layout: str) -> torch.Tensor:
    """A clip batch in ``layout`` ("auto": found from where the channels are) as (B, C, T, H, W)."""
    if x.ndim != 5:
        raise ValueError(f"expected a video batch (B, C, T, H, W) or (B, T, C, H, W), got shape {tuple(x.shape)}")
    if layout == "auto":
        layout = "BCTHW" if x.shape[1] == channels else "BTCHW" if x.shape[2] == channels else None
    if layout is None:
        raise ValueError(f"expected {channels} input channels on axis 1 (B, C, T, H, W) or axis 2 (B, T, C, H, W), "
                         f"got shape {tuple(x.shape)}")
    return x if layout == "BCTHW" else x.transpose(1, 2)


torch.fx.wrap("to_bcthw")  # opaque under any torch.fx trace, not only timm's (whose autowrap covers vit.py only)
