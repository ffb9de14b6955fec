"""Every position encoding behind one interface (:class:`PositionEncoding`).

One module per family; importing this package registers every encoding. To add one: subclass
:class:`PositionEncoding` in a module of its family, override the hooks of its mechanism(s), decorate it
with ``@register_encoding("name")`` and import the module here.
"""

from .base import EncodingContext, PositionEncoding, TokenPositions, grid_positions
from .catalog import (
    ALiBi,
    AxialRoPE,
    DINOv3RoPE,
    LearnedAbsolute,
    LieRE,
    LookHere,
    NoPosition,
    PaPE,
    PaPERI,
    PolarRoPE,
    RoPEMixed,
    SaPE2,
    SinCos,
    create_encoding,
    encoding_class,
    list_encodings,
    register_encoding,
)

__all__ = [
    "ALiBi", "AxialRoPE", "DINOv3RoPE", "EncodingContext", "LearnedAbsolute", "LieRE", "LookHere", "NoPosition",
    "PaPE", "PaPERI", "PolarRoPE", "PositionEncoding", "RoPEMixed", "SaPE2", "SinCos", "TokenPositions",
    "create_encoding", "encoding_class", "grid_positions", "list_encodings", "register_encoding",
]
