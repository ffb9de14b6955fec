"""transformers configuration of the pape_hub ViViT: ViViT's field names (``num_frames``, ``tubelet_size``, ...)
plus the position encoding, on top of the image configuration."""

from __future__ import annotations

from typing import Any

from .configuration_pape_vit import CONFIG_CLASSES, PapeViTConfig

__all__ = ["PapeViViTConfig"]


class PapeViViTConfig(PapeViTConfig):
    r"""
    Configuration of :class:`PapeViViTModel` / :class:`PapeViViTForVideoClassification`.

    The image configuration's fields (``hidden_size``, ``position_encoding``, ...; ``image_size`` is the frame
    size) plus ViViT's:

    num_frames (`int`): frames of the nominal clip (the training grid's time extent).
    tubelet_size (`list[int]`): (t, h, w) of one token; ``patch_size`` follows its h.
    temporal_scale (`float`): length of one tubelet step in time, in spatial patches.
    """

    model_type = "pape_vivit"
    is_video = True

    num_frames: int = 16
    tubelet_size: list[int] | tuple[int, ...] = (2, 16, 16)
    temporal_scale: float = 1.0

    def timm_name(self) -> str:
        return self.timm_architecture or f"vivit_t16_{self.position_encoding}"

    #: the image rows, the tubelet's h as ``patch_size`` (its own row below), and ViViT's own
    core_fields = tuple(row for row in PapeViTConfig.core_fields if row[0] != "patch_size") + (
        ("num_frames", "num_frames"), ("tubelet_size", "tubelet_size"), ("temporal_scale", "temporal_scale"))

    def core_kwargs(self, num_classes: int) -> dict[str, Any]:
        """Constructor arguments of the shared core ``VideoVisionTransformer`` (the timm model)."""
        return dict(super().core_kwargs(num_classes), tubelet_size=list(self.tubelet_size))

    @classmethod
    def from_core_kwargs(cls, kwargs: dict[str, Any], **extra: Any) -> PapeViViTConfig:
        tubelet = [int(v) for v in kwargs.get("tubelet_size", cls.tubelet_size)]
        return super().from_core_kwargs({**kwargs, "tubelet_size": tubelet}, patch_size=tubelet[1], **extra)


CONFIG_CLASSES[PapeViViTConfig.model_type] = PapeViViTConfig
