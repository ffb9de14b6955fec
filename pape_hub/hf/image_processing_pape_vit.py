"""Image processor of the pape_hub ViT: ViT's (resize, rescale, normalise), sized and normalised per model."""

from __future__ import annotations

from transformers import ViTImageProcessor


class PapeViTImageProcessor(ViTImageProcessor):
    """``ViTImageProcessor`` with the model's resolution and normalisation (bicubic, as timm).

    Its saved config names no ``auto_map``: the model's ``config.json`` does (``AutoImageProcessor``), which is
    where transformers looks without pape_hub. An ``auto_map`` here would make transformers' video-processor
    fallback derive a remote ``PapeViTVideoProcessor`` for image pipelines and ask whether to run custom code
    (a prompt that hangs a notebook), even with pape_hub imported."""

    model_input_names = ["pixel_values"]
