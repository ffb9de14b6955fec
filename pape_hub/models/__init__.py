from .vit import VisionTransformer
from .zoo import MODEL_SIZES, PATCH_SETTINGS, list_pape_models, model_args_for

__all__ = ["MODEL_SIZES", "PATCH_SETTINGS", "VisionTransformer", "list_pape_models", "model_args_for"]
