"""pape_hub: every modern vision position encoding behind one interface, in timm and transformers ViTs.

``import pape_hub`` registers the models ``vit_{t,s,b,l}16_{encoding}``, ``vit_{t,s}4_{encoding}`` and
``vivit_{t,s,b}16_{encoding}`` in timm and, when transformers is installed (``pip install pape_hub[hf]``), the
``pape_vit`` / ``pape_vivit`` model types with transformers' Auto classes. The models need torch and timm only.
"""

from importlib import import_module
from importlib.util import find_spec
from typing import Any

from .encodings import EncodingContext, PositionEncoding, TokenPositions, create_encoding, list_encodings
from .models import (
    PUBLISHED_WEIGHTS,
    VisionTransformer,
    list_pape_models,
    list_pretrained,
    model_args_for,
    register_published_weights,
    transplant,
)

if find_spec("transformers") is not None:
    from . import hf  # noqa: F401 - registers the transformers Auto classes

__version__ = "0.1.0"

#: names that need an optional extra, imported on first use: name -> (module, extra that installs it)
_LAZY = {
    "load_checkpoint": (".checkpoint", "hf"), "save_checkpoint": (".checkpoint", "hf"),
    "push_checkpoint": (".hub", "hf"), "PapeViTConfig": (".hf", "hf"),
    "PapeViTForImageClassification": (".hf", "hf"), "PapeViTImageProcessor": (".hf", "hf"),
    "PapeViTModel": (".hf", "hf"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'pape_hub' has no attribute {name!r}")
    module, extra = _LAZY[name]
    try:
        return getattr(import_module(module, __name__), name)
    except ImportError as err:
        raise ImportError(f"pape_hub.{name} needs the '{extra}' extra: pip install 'pape_hub[{extra}]' "
                          f"({err})") from err


__all__ = [
    "PUBLISHED_WEIGHTS", "EncodingContext", "PapeViTConfig", "PapeViTForImageClassification",
    "PapeViTImageProcessor", "PapeViTModel", "PositionEncoding", "TokenPositions", "VisionTransformer",
    "create_encoding", "list_encodings", "list_pape_models", "list_pretrained", "load_checkpoint", "model_args_for",
    "push_checkpoint", "register_published_weights", "save_checkpoint", "transplant",
]
