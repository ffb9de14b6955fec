"""Video processor of the pape_hub ViViT: every frame resized to the model's resolution, rescaled to [0, 1] and
normalised with the model's mean and std; output ``pixel_values`` (B, T, C, H, W) like transformers' ViViT."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import PILImageResampling
from transformers.video_processing_utils import BaseVideoProcessor

from .remote_code import record_auto_map

__all__ = ["PapeViViTVideoProcessor"]


class PapeViViTVideoProcessor(BaseVideoProcessor):
    resample = PILImageResampling.BICUBIC
    size = {"height": 224, "width": 224}
    do_resize = True
    do_center_crop = False
    do_rescale = True
    rescale_factor = 1 / 255
    do_normalize = True
    do_convert_rgb = True
    do_sample_frames = False
    model_input_names = ["pixel_values"]

    def preprocess(self, videos: Any, **kwargs: Any) -> BatchFeature:
        batch = super().preprocess(videos, **kwargs)
        batch["pixel_values"] = batch.pop("pixel_values_videos")
        return batch

    def save_pretrained(self, save_directory: str | Path, *args: Any, **kwargs: Any) -> Any:
        """Also record ``auto_map`` so the folder loads with ``trust_remote_code=True`` without pape_hub."""
        out = super().save_pretrained(save_directory, *args, **kwargs)
        record_auto_map(Path(save_directory) / "video_preprocessor_config.json",
                        {"AutoVideoProcessor": "video_processing_pape_vivit.PapeViViTVideoProcessor"})
        return out
