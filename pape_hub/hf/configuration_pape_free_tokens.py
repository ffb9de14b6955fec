"""transformers configurations of the point-cloud (``pape_pointvit``) and event-stream (``pape_eventvit``) models:
the image configuration's transformer fields, without the image ones, plus each stem's fields."""

from __future__ import annotations

from typing import Any

from .configuration_pape_vit import CONFIG_CLASSES, PapeViTConfig

__all__ = ["PapeEventViTConfig", "PapeFreeTokenConfig", "PapePointViTConfig"]

#: the image rows of the field map, which tokens at free coordinates do not have
_IMAGE_FIELDS = ("image_size", "patch_size", "position_interpolation")


class PapeFreeTokenConfig(PapeViTConfig):
    """What the point and event configurations share: the transformer's fields (``hidden_size``, ...,
    ``position_encoding``), no image size, patch or position interpolation. A subclass adds its stem's rows."""

    family = ""  # the timm family name, e.g. "pointvit"
    core_fields = tuple(row for row in PapeViTConfig.core_fields if row[0] not in _IMAGE_FIELDS)

    def timm_name(self) -> str:
        return self.timm_architecture or f"{self.family}_m_{self.position_encoding}"

    def core_kwargs(self, num_classes: int) -> dict[str, Any]:
        kwargs = super().core_kwargs(num_classes)
        kwargs.pop("position_interpolation", None)
        return kwargs


class PapePointViTConfig(PapeFreeTokenConfig):
    r"""
    Configuration of :class:`PapePointViTModel` / :class:`PapePointViTForClassification`: the transformer's fields
    plus the point stem's.

    num_channels (`int`): values per point, x, y, z first (3, or 6 with normals).
    num_groups (`int`): tokens per cloud (farthest-point centres).
    group_size (`int`): points per group.
    group_hidden_dim (`int`): width of the groups' shared MLP.
    coord_scale (`float`): position units per unit of the cloud's coordinates.
    rotation_invariant_groups (`bool`): describe points by what a rotation keeps instead of relative coordinates.
    """

    model_type = "pape_pointvit"
    family = "pointvit"

    num_groups: int = 64
    group_size: int = 32
    group_hidden_dim: int = 128
    coord_scale: float = 4.0
    rotation_invariant_groups: bool = False

    core_fields = PapeFreeTokenConfig.core_fields + (
        ("num_groups", "num_groups"), ("group_size", "group_size"), ("group_hidden_dim", "group_hidden_dim"),
        ("coord_scale", "coord_scale"), ("rotation_invariant_groups", "rotation_invariant_groups"))


class PapeEventViTConfig(PapeFreeTokenConfig):
    r"""
    Configuration of :class:`PapeEventViTModel` / :class:`PapeEventViTForClassification`: the transformer's fields
    plus the event stem's (events are (x, y, t, polarity): ``num_channels`` is 4).

    sensor_size (`list[int]`): (height, width) of the camera in pixels.
    event_patch_size (`int`): pixels per cell side.
    threshold (`int`): events a cell collects per token.
    time_scale (`float`): time stamps per position unit.
    max_tokens (`int`): the most tokens per stream.
    nominal_duration (`float`): a typical stream's length in time stamps.
    """

    model_type = "pape_eventvit"
    family = "eventvit"

    num_channels: int = 4
    sensor_size: list[int] | tuple[int, ...] = (128, 128)
    event_patch_size: int = 8
    threshold: int = 64
    time_scale: float = 20_000.0
    max_tokens: int = 1024
    nominal_duration: float = 1_000_000.0

    core_fields = PapeFreeTokenConfig.core_fields + (
        ("sensor_size", "sensor_size"), ("event_patch_size", "event_patch_size"), ("threshold", "threshold"),
        ("time_scale", "time_scale"), ("max_tokens", "max_tokens"), ("nominal_duration", "nominal_duration"))

    def core_kwargs(self, num_classes: int) -> dict[str, Any]:
        return dict(super().core_kwargs(num_classes), sensor_size=list(self.sensor_size))


CONFIG_CLASSES[PapePointViTConfig.model_type] = PapePointViTConfig
CONFIG_CLASSES[PapeEventViTConfig.model_type] = PapeEventViTConfig
