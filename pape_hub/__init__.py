"""pape_hub: every modern vision position encoding behind one interface, in timm and transformers ViTs.

``import pape_hub`` registers the models ``vit_{t,s,b,l}16_{encoding}`` and ``vit_{t,s}4_{encoding}`` in timm and
the ``pape_vit`` model type with transformers' Auto classes.
"""

from .checkpoint import load_checkpoint, save_checkpoint
from .encodings import EncodingContext, PositionEncoding, TokenPositions, create_encoding, list_encodings
from .hf import (  # noqa: E402 - registers the transformers Auto classes
    PapeViTConfig,
    PapeViTForImageClassification,
    PapeViTImageProcessor,
    PapeViTModel,
)
from .hub import push_checkpoint
from .models import (
    PUBLISHED_WEIGHTS,
    VisionTransformer,
    list_pape_models,
    model_args_for,
    register_published_weights,
)

__version__ = "0.1.0"
__all__ = [
    "PUBLISHED_WEIGHTS", "EncodingContext", "PapeViTConfig", "PapeViTForImageClassification",
    "PapeViTImageProcessor", "PapeViTModel", "PositionEncoding", "TokenPositions", "VisionTransformer",
    "create_encoding", "list_encodings", "list_pape_models", "load_checkpoint", "model_args_for", "push_checkpoint",
    "register_published_weights", "save_checkpoint",
]
