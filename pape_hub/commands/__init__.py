"""Command implementations shared by ``pape-hub <command>`` and ``scripts/<command>.py``, and the flags made from
the configs they fill (:func:`add_config_arguments`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from typing import Any

__all__ = ["add_config_arguments", "config_values", "floats", "json_object"]


def floats(text: str) -> tuple[float, ...]:
    """``"0.08,1"`` -> (0.08, 1.0), for a flag of several numbers."""
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from err


def json_object(text: str) -> dict[str, Any]:
    """A flag holding a JSON object (e.g. model constructor arguments)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON: {err}") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _flag_type(annotation: Any) -> Any:
    """The argparse type of a field annotation (``X | None`` -> X; tuples of numbers and dicts from text)."""
    members = [a for a in typing.get_args(annotation) if a is not type(None)] \
        if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union else [annotation]
    base = typing.get_origin(members[0]) or members[0]
    return {tuple: floats, dict: json_object}.get(base, base)


def add_config_arguments(parser: argparse.ArgumentParser, config_class: type, *, prefix: str = "",
                         only: typing.Iterable[str] | None = None, preset_defaults: bool = False) -> None:
    """One flag per field of a dataclass config declared with :func:`pape_hub.settings.setting`: ``--field-name``
    (``--PREFIX-field-name`` for a nested config, stored as ``PREFIX_field_name``), its type from the annotation,
    its default from the field (``preset_defaults``: None, for a command that fills unset values from a preset),
    its help, choices, metavar and ``aliases`` (more flag names) from the field's metadata."""
    hints = typing.get_type_hints(config_class)
    wanted = None if only is None else set(only)
    for f in dataclasses.fields(config_class):
        meta = f.metadata
        if meta.get("flag") is False or (wanted is not None and f.name not in wanted):
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        name = "-".join(filter(None, [prefix, meta.get("flag", f.name)])).replace("_", "-")
        dest = "_".join(filter(None, [prefix, f.name]))
        kind = _flag_type(hints[f.name])
        if kind is bool and meta.get("negated"):
            parser.add_argument(f"--{meta['negated'].replace('_', '-')}", dest=dest, action="store_false",
                                help=meta.get("help"))
        elif kind is bool:
            parser.add_argument(f"--{name}", dest=dest, action="store_true", help=meta.get("help"))
        else:
            text = meta.get("help", "") + ("; unset: the preset's" if preset_defaults else "")
            metavar = meta.get("metavar") or (None if meta.get("choices") else name.upper().replace("-", "_"))
            aliases = [f"--{a}" for a in meta.get("aliases", ())]  # another library's name for the same setting
            parser.add_argument(f"--{name}", *aliases, dest=dest, type=kind,
                                default=None if preset_defaults else default, choices=meta.get("choices"),
                                metavar=metavar, help=text)


def config_values(args: argparse.Namespace, config_class: type, prefix: str = "",
                  only: typing.Iterable[str] | None = None) -> dict[str, Any]:
    """The fields of ``config_class`` (``only`` these) that flags made by :func:`add_config_arguments` set (None:
    not given)."""
    wanted = None if only is None else set(only)
    names = {f.name: "_".join(filter(None, [prefix, f.name])) for f in dataclasses.fields(config_class)
             if wanted is None or f.name in wanted}
    return {name: getattr(args, dest) for name, dest in names.items() if getattr(args, dest, None) is not None}
