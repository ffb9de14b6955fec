"""Image processor of the pape_hub ViT: ViT's (resize, rescale, normalise), sized and normalised per model."""

from __future__ import annotations

from transformers import ViTImageProcessor


class PapeViTImageProcessor(ViTImageProcessor):
    """``ViTImageProcessor`` under the name checkpoint folders saved before pape_hub 0.2 give in their
    ``preprocessor_config.json``; such folders still load with pape_hub imported (it is registered with
    ``AutoImageProcessor`` for ``pape_vit`` configs). Folders saved now name transformers' own ``ViTImageProcessor``
    (``pape_hub.hf.image_processor_for``), which every process loads without custom code."""

    model_input_names = ["pixel_values"]
