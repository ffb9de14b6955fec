"""pape_hub: every modern vision position encoding behind one interface, in timm ViTs.

``import pape_hub`` registers the models ``vit_{t,s,b,l}16_{encoding}`` and ``vit_{t,s}4_{encoding}`` in timm.
"""

from .encodings import EncodingContext, PositionEncoding, TokenPositions, create_encoding, list_encodings
from .hf import (  # noqa: E402 - registers the transformers Auto classes
    PapeViTConfig,
    PapeViTForImageClassification,
    PapeViTImageProcessor,
    PapeViTModel,
)
from .models import VisionTransformer, list_pape_models, model_args_for

__version__ = "0.1.0"
__all__ = [
    "EncodingContext", "PapeViTConfig", "PapeViTForImageClassification", "PapeViTImageProcessor", "PapeViTModel",
    "PositionEncoding", "TokenPositions", "VisionTransformer", "create_encoding",
    "list_encodings", "list_pape_models", "model_args_for",
]
