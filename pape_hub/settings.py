"""Settings that describe their own command-line flags.

A config dataclass (``TrainConfig``, the generated tasks' ``ArrowConfig`` / ``MotionConfig``) declares each field
with :func:`setting`; ``pape_hub.commands.add_config_arguments`` turns the fields into flags (name, type, default,
choices and a one-line help), so a flag is never restated by hand beside the field it fills.
"""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any

__all__ = ["setting"]


def setting(default: Any = MISSING, help: str = "", *, default_factory: Any = MISSING, **flag: Any) -> Any:  # noqa: A002
    """A dataclass field with its flag's description in ``metadata``: ``help``, and where the flag is not simply
    ``--field-name``: ``flag`` (another name, without the dashes; ``False``: no flag), ``choices``, ``metavar``,
    ``negated`` (the name of a flag that sets a default-True boolean to False), ``aliases`` (more names of the flag,
    e.g. another library's)."""
    return field(default=default, default_factory=default_factory, metadata=dict(help=help, **flag))
