"""transformers models of the pape_hub ViViT: the image models' code with the video core
(:class:`~pape_hub.models.vivit.VideoVisionTransformer`) and transformers' ViViT input layout
``pixel_values`` (B, T, C, H, W)."""

from __future__ import annotations

import torch

from ..models.vivit import VideoVisionTransformer
from .configuration_pape_vivit import PapeViViTConfig
from .modeling_pape_vit import PapeViTForImageClassification, PapeViTModel, PapeViTPreTrainedModel
from .video_processing_pape_vivit import PapeViViTVideoProcessor

__all__ = ["PapeViViTForVideoClassification", "PapeViViTModel", "PapeViViTPreTrainedModel"]

AUTO_MAP = {
    "AutoConfig": "configuration_pape_vivit.PapeViViTConfig",
    "AutoModel": "modeling_pape_vivit.PapeViViTModel",
    "AutoModelForVideoClassification": "modeling_pape_vivit.PapeViViTForVideoClassification",
    "AutoVideoProcessor": "video_processing_pape_vivit.PapeViViTVideoProcessor",
}


def video_processor_of(config: PapeViViTConfig) -> PapeViViTVideoProcessor:
    """Resize every frame to the model's resolution, rescale to [0, 1], normalise with the model's mean and std."""
    mean, std = config.normalisation()
    size = config.image_size
    return PapeViViTVideoProcessor(size={"height": size, "width": size}, image_mean=mean, image_std=std)


class PapeViViTPreTrainedModel(PapeViTPreTrainedModel):
    config_class = PapeViViTConfig
    core_class = VideoVisionTransformer
    auto_map = AUTO_MAP
    input_modalities = ("video",)

    def _processor(self) -> PapeViViTVideoProcessor:
        return video_processor_of(self.config)

    def _core_input(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, T, C, H, W), transformers' ViViT layout -> (B, C, T, H, W), the core's."""
        if pixel_values.ndim != 5:
            raise ValueError(f"expected pixel_values (B, T, C, H, W), got shape {tuple(pixel_values.shape)}")
        return pixel_values.transpose(1, 2)


class PapeViViTModel(PapeViViTPreTrainedModel, PapeViTModel):
    """The backbone: final tokens (``last_hidden_state``) and the pooled, normed summary (``pooler_output``)."""


class PapeViViTForVideoClassification(PapeViViTPreTrainedModel, PapeViTForImageClassification):
    """Backbone + linear head (``config.num_labels`` classes); the loss follows ``config.problem_type``."""
