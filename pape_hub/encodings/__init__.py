"""Every position encoding behind one interface (:class:`PositionEncoding`).

One module per family; importing this package registers every encoding. To add one: subclass
:class:`PositionEncoding` in a module of its family, override the hooks of its mechanism(s), decorate it
with ``@register_encoding("name")`` and import the module here.
"""

from . import absolute, rotary, alibi, pape, sape2, liere  # noqa: F401, I001 - registration order = list order
from .absolute import LearnedAbsolute, NoPosition, SinCos
from .alibi import ALiBi, LookHere
from .base import EncodingContext, PositionEncoding, TokenPositions, grid_positions
from .liere import LieRE
from .pape import PaPE, PaPERI
from .registry import create_encoding, encoding_class, list_encodings, register_encoding
from .rotary import AxialRoPE, PolarRoPE, RoPEMixed
from .sape2 import SaPE2

__all__ = [
    "ALiBi", "AxialRoPE", "EncodingContext", "LearnedAbsolute", "LieRE", "LookHere", "NoPosition", "PaPE", "PaPERI",
    "PolarRoPE", "PositionEncoding", "RoPEMixed", "SaPE2", "SinCos", "TokenPositions", "create_encoding",
    "encoding_class", "grid_positions", "list_encodings", "register_encoding",
]
