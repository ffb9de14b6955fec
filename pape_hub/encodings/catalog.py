"""Importing this module registers every encoding; registration order is ``list_encodings()`` order."""

from .absolute import LearnedAbsolute, NoPosition, SinCos
from .alibi import ALiBi, LookHere
from .liere import LieRE
from .pape import PaPE, PaPERI
from .registry import check_encoding_kwargs, create_encoding, encoding_class, list_encodings, register_encoding
from .rotary import AxialRoPE, DINOv3RoPE, PolarRoPE, RoPEMixed
from .sape2 import SaPE2

__all__ = [
    "ALiBi", "AxialRoPE", "DINOv3RoPE", "LearnedAbsolute", "LieRE", "LookHere", "NoPosition", "PaPE", "PaPERI",
    "PolarRoPE", "RoPEMixed", "SaPE2", "SinCos", "check_encoding_kwargs", "create_encoding", "encoding_class",
    "list_encodings", "register_encoding",
]
