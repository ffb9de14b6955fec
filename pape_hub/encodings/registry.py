"""Name -> encoding class (+ default arguments). Add an encoding with ``@register_encoding("name")``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .base import EncodingContext, PositionEncoding

__all__ = ["create_encoding", "encoding_class", "list_encodings", "register_encoding"]

_REGISTRY: dict[str, tuple[type[PositionEncoding], dict[str, Any]]] = {}


def register_encoding(name: str, **defaults: Any) -> Callable[[type[PositionEncoding]], type[PositionEncoding]]:
    """Register a class under ``name``; ``defaults`` make a variant (e.g. ``liere8`` = LieRE with block 8)."""

    def wrap(cls: type[PositionEncoding]) -> type[PositionEncoding]:
        if name in _REGISTRY:
            raise ValueError(f"position encoding {name!r} is registered twice")
        _REGISTRY[name] = (cls, defaults)
        return cls

    return wrap


def list_encodings() -> list[str]:
    """Every registered encoding name, in registration order."""
    return list(_REGISTRY)


def encoding_class(name: str) -> tuple[type[PositionEncoding], dict[str, Any]]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown position encoding {name!r}; valid names: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def create_encoding(name: str, ctx: EncodingContext, **kwargs: Any) -> PositionEncoding:
    """Build encoding ``name`` for a model described by ``ctx``; kwargs override the registered defaults."""
    cls, defaults = encoding_class(name)
    cls.check_ndim(name, ctx)
    params = inspect.signature(cls.__init__).parameters
    accepted = [p for p in params if p not in ("self", "ctx")]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(
            f"position encoding {name!r} got unknown argument(s) {unknown}; it accepts {accepted or 'none'}"
        )
    enc = cls(ctx, **{**defaults, **kwargs})
    enc.name = name  # variants share a class; the instance carries the registered name
    return enc
