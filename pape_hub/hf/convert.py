"""Lossless conversion between the timm face (``timm.create_model("vit_b16_pape")``) and the transformers face
(``PapeViTForImageClassification``): same core module, same tensors, the state dict differs by a ``vit.`` prefix."""

from __future__ import annotations

from typing import Any

import timm
from transformers import BitImageProcessor, Siglip2ImageProcessor

from ..folder import PIL_RESAMPLE, DataConfig
from ..models.free_tokens import FreeTokenTransformer
from ..models.pointvit import PointVisionTransformer
from ..models.vit import VisionTransformer
from .configuration_pape_free_tokens import PapeEventViTConfig, PapeFreeTokenConfig, PapePointViTConfig
from .configuration_pape_vit import PapeViTConfig
from .configuration_pape_vivit import PapeViViTConfig
from .modeling_pape_free_tokens import (
    PapeEventViTForClassification,
    PapeEventViTModel,
    PapePointViTForClassification,
    PapePointViTModel,
)
from .modeling_pape_vit import PapeViTForImageClassification, PapeViTModel, data_config_of, image_processor_of
from .modeling_pape_vivit import PapeViViTForVideoClassification, PapeViViTModel, video_processor_of
from .video_processing_pape_vivit import PapeViViTVideoProcessor

__all__ = [
    "config_from_timm", "free_token_config", "image_processor_for", "native_processor_for", "processor_for",
    "timm_to_transformers", "transformers_class", "transformers_to_timm", "video_processor_for",
]


def config_from_timm(model: VisionTransformer, label_names: list[str] | None = None,
                     image_mean: Any = None, image_std: Any = None) -> PapeViTConfig:
    """The transformers configuration of a pape_hub timm model (its recorded constructor arguments)."""
    if isinstance(model, FreeTokenTransformer):
        return free_token_config(model, label_names)
    args = dict(getattr(model, "_model_args", {}))
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    architecture = cfg.get("architecture")
    if architecture is None:
        raise ValueError("model was not made by timm.create_model; pass a pape_hub timm model")
    from ..models.zoo import model_args_for

    full = {**model_args_for(architecture), **args}
    full["img_size"] = list(model.patch_embed.img_size)
    if model.is_video:
        full["num_frames"] = model.patch_embed.num_frames
    labels = label_names or [f"LABEL_{i}" for i in range(model.num_classes)]
    config_class = PapeViViTConfig if model.is_video else PapeViTConfig
    return config_class.from_core_kwargs(
        full, timm_architecture=architecture, id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
        image_mean=list(image_mean or cfg.get("mean", (0.485, 0.456, 0.406))),
        image_std=list(image_std or cfg.get("std", (0.229, 0.224, 0.225))),
    )


def free_token_config(model: FreeTokenTransformer, label_names: list[str] | None = None) -> PapeFreeTokenConfig:
    """The transformers configuration of a point or event model (the constructor arguments it records)."""
    from ..models.zoo import free_token_architecture

    # the given labels, else those the model was loaded with (a checkpoint saved again), else LABEL_i
    labels = label_names or (getattr(model, "pretrained_cfg", None) or {}).get("label_names") or \
        [f"LABEL_{i}" for i in range(model.num_classes)]
    config_class = PapePointViTConfig if isinstance(model, PointVisionTransformer) else PapeEventViTConfig
    return config_class.from_core_kwargs(
        model.model_args, timm_architecture=free_token_architecture(model), id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)})


def transformers_class(config: PapeViTConfig, head: bool) -> type:
    """The transformers model class of a configuration: with the classification head, or the backbone."""
    if isinstance(config, PapePointViTConfig):
        return PapePointViTForClassification if head else PapePointViTModel
    if isinstance(config, PapeEventViTConfig):
        return PapeEventViTForClassification if head else PapeEventViTModel
    if config.is_video:
        return PapeViViTForVideoClassification if head else PapeViViTModel
    return PapeViTForImageClassification if head else PapeViTModel


def timm_to_transformers(model: VisionTransformer, label_names: list[str] | None = None, head: bool = True,
                         image_mean: Any = None, image_std: Any = None) -> PapeViTForImageClassification | PapeViTModel:
    """A transformers model holding exactly the timm model's weights (``image_mean``/``image_std``: the
    normalisation it was trained with, default the timm model's ``pretrained_cfg``)."""
    config = config_from_timm(model, label_names, image_mean, image_std)
    hf = transformers_class(config, head and bool(model.num_classes))(config)
    state = {k: v for k, v in model.state_dict().items() if head or not k.startswith("head.")}
    missing, unexpected = hf.vit.load_state_dict(state, strict=head)
    if unexpected:
        raise ValueError(f"unexpected keys converting to transformers: {unexpected}")
    return hf.eval() if not model.training else hf


def transformers_to_timm(model: PapeViTForImageClassification | PapeViTModel, **overrides: Any) -> VisionTransformer:
    """The timm model (``timm.create_model(architecture, ...)``) holding the transformers model's weights."""
    config = model.config
    args = config.core_kwargs(model.vit.num_classes)
    args.update(overrides)
    timm_model = timm.create_model(config.timm_name(), **args)
    timm_model.load_state_dict(model.vit.state_dict())
    return timm_model.train(model.training)


#: the processors of a configuration, made where the models' own ``save_pretrained`` makes them
video_processor_for = video_processor_of
image_processor_for = image_processor_of


def processor_for(config: PapeViTConfig, data_config: DataConfig | None = None
                  ) -> BitImageProcessor | PapeViViTVideoProcessor:
    """The image processor of an image model (from ``data_config``, default the configuration's), the video
    processor of a video model."""
    return video_processor_for(config) if config.is_video else image_processor_for(config, data_config)


def native_processor_for(config: PapeViTConfig, max_num_patches: int = 256,
                         data_config: DataConfig | None = None) -> Siglip2ImageProcessor:
    """transformers' own SigLIP2 processor for native-resolution batches: each image resized, aspect ratio kept,
    to at most ``max_num_patches`` of the model's patches, patchified and padded; its ``pixel_values``,
    ``pixel_attention_mask`` and ``spatial_shapes`` go straight into the model (``model(**processor(images))``),
    which reads each patch at its own coordinate. Normalisation and resampling from the checkpoint's data config."""
    data = data_config or data_config_of(config)
    return Siglip2ImageProcessor(patch_size=config.patch_size, max_num_patches=max_num_patches,
                                 image_mean=list(data.mean), image_std=list(data.std),
                                 resample=PIL_RESAMPLE[data.interpolation])
