"""Point-cloud transformer (Point-BERT / Point-MAE tokens) with a pluggable position encoding.

``forward(points, valid=None)``: points (B, N, 3 + C), x, y, z first and optional per-point values after (normals,
colours), and ``valid`` (B, N) marking padding. Tokens are local groups at their centres' 3-D coordinates
(:class:`~pape_hub.layers.point_groups.PointGroupEmbed`); the rest is the ViT core. Clouds are expected centred and
scaled to the unit sphere, as ModelNet pipelines do (the data pipeline's job, not the model's).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..layers.point_groups import PointGroupEmbed
from .free_tokens import FreeTokenTransformer

__all__ = ["PointVisionTransformer"]


class PointVisionTransformer(FreeTokenTransformer):
    """Arguments as :class:`~pape_hub.models.vit.VisionTransformer` (no image ones) plus the stem's:

    num_groups: tokens per cloud (farthest-point centres).
    group_size: points per group (nearest neighbours of a centre).
    group_hidden_dim: width of the groups' shared MLP.
    coord_scale: position units per unit of the cloud's coordinates.
    in_chans: per-point values, x, y, z first (3, or 6 with normals).
    rotation_invariant_groups: tokens from what a rotation keeps (distances, a dot product) instead of relative
        coordinates; with PaPE-RI or ALiBi and average pooling without CLS the whole model is rotation invariant.
    """

    input_name = "points"

    def __init__(self, num_groups: int = 64, group_size: int = 32, group_hidden_dim: int = 128,
                 coord_scale: float = 4.0, rotation_invariant_groups: bool = False, in_chans: int = 3,
                 **kwargs: Any) -> None:
        stem = partial(PointGroupEmbed, num_groups=num_groups, group_size=group_size, hidden_dim=group_hidden_dim,
                       coord_scale=coord_scale, rotation_invariant=rotation_invariant_groups)
        super().__init__(stem, in_chans=in_chans, **kwargs)
        self.model_args.update(num_groups=num_groups, group_size=group_size, group_hidden_dim=group_hidden_dim,
                               coord_scale=coord_scale, rotation_invariant_groups=rotation_invariant_groups)
