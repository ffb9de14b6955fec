"""Event-camera transformer (the PaPE paper's spiking patches) with a pluggable position encoding.

``forward(events, valid=None)``: events (B, N, 4) as (x, y, t, polarity), whole pixels of the sensor, and ``valid``
(B, N) marking padding. Tokens are cells of the sensor that fire every ``threshold`` events, at (x cell, y cell,
firing time / ``time_scale``) (:class:`~pape_hub.layers.event_patches.EventPatchEmbed`); the rest is the ViT core.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..layers.event_patches import EventPatchEmbed
from .free_tokens import FreeTokenTransformer

__all__ = ["EventVisionTransformer"]


class EventVisionTransformer(FreeTokenTransformer):
    """Arguments as :class:`~pape_hub.models.vit.VisionTransformer` (no image ones) plus the stem's:

    sensor_size: (height, width) of the camera in pixels.
    event_patch_size: pixels per cell side.
    threshold: events a cell collects per token.
    time_scale: time stamps per position unit (the time a feature takes to cross a cell is a good value).
    max_tokens: the most tokens per stream (the earliest firings).
    nominal_duration: a typical stream's length in time stamps (the time extent the encodings are told of).
    """

    input_name = "events"

    def __init__(self, sensor_size: tuple[int, int] | list[int] = (128, 128), event_patch_size: int = 8,
                 threshold: int = 16, time_scale: float = 1.0, max_tokens: int = 512, nominal_duration: float = 16.0,
                 **kwargs: Any) -> None:
        if kwargs.pop("in_chans", 4) != 4:
            raise ValueError("events are (x, y, t, polarity): in_chans is 4")
        stem = partial(EventPatchEmbed, sensor_size=tuple(sensor_size), patch_size=event_patch_size,
                       threshold=threshold, time_scale=time_scale, max_tokens=max_tokens,
                       nominal_duration=nominal_duration)
        super().__init__(lambda in_chans, embed_dim: stem(embed_dim=embed_dim), in_chans=4, **kwargs)
        self.model_args.update(sensor_size=list(self.patch_embed.sensor_size), event_patch_size=event_patch_size,
                               threshold=threshold, time_scale=time_scale, max_tokens=max_tokens,
                               nominal_duration=nominal_duration)
