"""Name -> encoding class (+ default arguments). Add an encoding with ``@register_encoding("name")``."""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from .base import EncodingContext, PositionEncoding

__all__ = ["create_encoding", "encoding_class", "free_coordinates_problem", "list_encodings", "register_encoding"]

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


def free_coordinates_problem(name: str, ndim: int) -> str | None:
    """Why encoding ``name`` cannot position tokens at free ``ndim``-D coordinates (point clouds, events), or None
    when it can: it is defined for other dimensions only, or it needs whole grid cells (a learned table of cells,
    counts along rows, or the learned table a ``*_ape`` variant adds)."""
    cls, defaults = encoding_class(name)
    if ndim not in cls.supported_ndims:
        return f"it is defined for {', '.join(f'{d}-D' for d in cls.supported_ndims)} positions only"
    if cls.grid_cells or defaults.get("with_ape"):
        return ("it reads a learned table of grid cells (or counts tokens along a grid's rows), and free "
                "coordinates have no cells")
    return None


def create_encoding(name: str, ctx: EncodingContext, **kwargs: Any) -> PositionEncoding:
    """Build encoding ``name`` for a model described by ``ctx``; kwargs override the registered defaults."""
    cls, defaults = encoding_class(name)
    cls.check_ndim(name, ctx)
    check_encoding_kwargs(name, kwargs)
    # variants share a class, so the instance carries the registered name; it is set before __init__ runs so that
    # the constructor's own errors can name the encoding
    enc = cls.__new__(cls)
    object.__setattr__(enc, "name", name)
    enc.__init__(ctx, **{**defaults, **kwargs})
    return enc


#: the largest integer an encoding setting takes (parabolas, block sizes, table lengths): a config asking for more is
#: refused before it allocates anything
MAX_INTEGER_SETTING = 2**16


def check_encoding_kwargs(name: str, kwargs: Any) -> None:
    """Refuse, naming the argument, what the encoding's constructor cannot take: unknown names, values of another
    type than its annotation, and numbers that are not finite and positive (every numeric setting of every
    encoding here is a size, a scale or a rate)."""
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"position_encoding_kwargs of {name!r} must be a dict of argument names to values, "
                        f"got {type(kwargs).__name__} {kwargs!r}")
    cls, _ = encoding_class(name)
    params = inspect.signature(cls.__init__).parameters
    accepted = [p for p in params if p not in ("self", "ctx")]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(f"position encoding {name!r} got unknown argument(s) {unknown}; "
                        f"it accepts {accepted or 'none'}")
    hints = typing.get_type_hints(cls.__init__)
    for key, value in kwargs.items():
        problem = _value_problem(value, hints.get(key, Any))
        if problem:
            raise ValueError(f"position encoding {name!r} argument {key}={value!r} {problem}")


def _value_problem(value: Any, hint: Any) -> str | None:
    """Why ``value`` does not fit the annotation ``hint`` (None if it does)."""
    if hint is Any:
        return None
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    if value is None:
        return None if type(None) in options else "must not be None"
    problems = []
    for option in options:
        if option is type(None):
            continue
        origin = typing.get_origin(option) or option
        if origin is tuple:
            if isinstance(value, (tuple, list)):
                inner = typing.get_args(option)
                if len(inner) == 2 and inner[1] is Ellipsis:
                    inner = (inner[0],) * len(value)
                if len(inner) != len(value):
                    return f"must have {len(inner)} entries"
                return next(filter(None, (_value_problem(v, t) for v, t in zip(value, inner))), None)
        elif origin in (int, float):
            if isinstance(value, bool) or not isinstance(value, int if origin is int else (int, float)):
                problems.append(f"must be {'an integer' if origin is int else 'a number'}")
                continue
            if not math.isfinite(value) or value <= 0:
                return "must be finite and positive"
            if origin is int and value > MAX_INTEGER_SETTING:
                return f"must be at most {MAX_INTEGER_SETTING} (a count or size, never this large)"
            return None
        elif isinstance(value, origin):
            return None
        else:
            problems.append(f"must be {origin.__name__}")
    return problems[0] if problems else f"does not fit {hint}"
