"""Image processor of the pape_hub ViT: ViT's (resize, rescale, normalise), sized and normalised per model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import ViTImageProcessor

from .remote_code import record_auto_map


class PapeViTImageProcessor(ViTImageProcessor):
    """``ViTImageProcessor`` with the model's resolution and normalisation (bicubic, as timm)."""

    model_input_names = ["pixel_values"]

    def save_pretrained(self, save_directory: str | Path, *args: Any, **kwargs: Any) -> Any:
        """Also record ``auto_map`` so the folder loads with ``trust_remote_code=True`` without pape_hub."""
        out = super().save_pretrained(save_directory, *args, **kwargs)
        record_auto_map(Path(save_directory) / "preprocessor_config.json",
                        {"AutoImageProcessor": "image_processing_pape_vit.PapeViTImageProcessor"})
        return out
