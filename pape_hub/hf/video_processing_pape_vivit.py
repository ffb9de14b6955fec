"""Video processor of the pape_hub ViViT: every frame resized to the model's resolution, rescaled to [0, 1] and
normalised with the model's mean and std; output ``pixel_values`` (B, T, C, H, W) like transformers' ViViT."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import PILImageResampling
from transformers.video_processing_utils import BaseVideoProcessor
from transformers.video_utils import load_video

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

    def fetch_videos(self, video_url_or_urls: Any, sample_indices_fn: Any = None) -> Any:
        """transformers decodes video files with torchcodec; where that is not installed (and torchvision no longer
        decodes), with PyAV, which transformers' video-classification pipeline needs anyway."""
        try:
            return super().fetch_videos(video_url_or_urls, sample_indices_fn=sample_indices_fn)
        except ImportError:
            if isinstance(video_url_or_urls, list):
                return list(zip(*[self.fetch_videos(v, sample_indices_fn) for v in video_url_or_urls]))
            return load_video(video_url_or_urls, backend="pyav", sample_indices_fn=sample_indices_fn)

    def save_pretrained(self, save_directory: str | Path, *args: Any, **kwargs: Any) -> Any:
        """Also record ``auto_map`` so the folder loads with ``trust_remote_code=True`` without pape_hub."""
        out = super().save_pretrained(save_directory, *args, **kwargs)
        record_auto_map(Path(save_directory) / "video_preprocessor_config.json",
                        {"AutoVideoProcessor": "video_processing_pape_vivit.PapeViViTVideoProcessor"})
        return out
