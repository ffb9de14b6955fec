from .pretrained import transplant
from .vit import VisionTransformer
from .zoo import (
    MODEL_SIZES,
    PATCH_SETTINGS,
    PUBLISHED_WEIGHTS,
    list_pape_models,
    list_pretrained,
    model_args_for,
    register_published_weights,
)

__all__ = ["MODEL_SIZES", "PATCH_SETTINGS", "PUBLISHED_WEIGHTS", "VisionTransformer", "list_pape_models",
           "list_pretrained", "model_args_for", "register_published_weights", "transplant"]
