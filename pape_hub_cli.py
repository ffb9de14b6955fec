"""The ``pape-hub`` command line.

This module lives beside the ``pape_hub`` package, not in it: ``import pape_hub`` registers every model with timm
(several seconds of imports: torch, torchvision, timm), and ``pape-hub --help`` / ``--version`` should not pay for
that. A
command's module (``pape_hub.commands.<name>``) is imported only once that command is chosen. ``pape-hub COMMAND
--help`` prints the command's help from ``pape_hub/commands/help.json`` without importing the package: the text
its parser renders, written by ``python scripts/write_cli_help.py`` and checked current by the test suite.

Errors print one line naming the problem (``--debug`` anywhere on the line shows the traceback instead).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["COMMANDS", "HelpFormatter", "cached_help", "command_help", "main", "write_help_cache"]
HELP_WIDTH = 100  # help is rendered at one width, so the cached text is the parser's own

COMMANDS = {
    "arrows": "the main job: train encodings on the arrow task and compare them on larger grids",
    "compare": "train several encodings on one dataset and compare them across resolutions (e.g. digits)",
    "train": "train a model (accelerate) on the arrow task, a video task or an image/video dataset",
    "eval": "evaluate a checkpoint across sizes, with and without position interpolation",
    "convert": "a public ImageNet checkpoint (pape_hub.list_pretrained()) as a checkpoint folder with its card",
    "push": "upload a checkpoint folder (weights, config, code, model card, results) to the Hub",
    "hub": "a Hugging Face Hub endpoint on 127.0.0.1 (`pape-hub hub serve`) for offline push and pull",
    "card": "write a checkpoint's model card from its results JSON",
    "report": "regenerate the README's results tables from results/ (or --check that they are current)",
    "bench": "speed of every encoding against timm's own ViTs",
    "profile": "per-layer kernel counts and bytes moved by each encoding's positional work",
    "zoo": "build registered models and run them at two resolutions",
}


#: commands that run for a while: they say so before the seconds their imports take
LONG_COMMANDS = ("arrows", "compare", "train", "eval", "convert", "bench", "profile", "zoo")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after every option (also those without a help text); a help text that already states its
    default is left as it is; descriptions (with their examples) keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text.lower():
            return text
        if action.default is None or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return text
        return f"{text} (default: %(default)s)".strip()

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and action.option_strings and action.default not in (None, argparse.SUPPRESS):
            action.help = "(default: %(default)s)"  # argparse prints a help line only for a help text
        return super()._format_action(action)


def package_version() -> str:
    try:
        return version("pape_hub")
    except PackageNotFoundError:
        return "unknown (not installed)"


def top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pape-hub", formatter_class=HelpFormatter,
        description="pape_hub: every modern vision position encoding in timm and transformers ViTs and ViViTs.",
        epilog="`pape-hub COMMAND --help` describes a command. Add --debug anywhere for a full traceback on error.")
    parser.add_argument("--version", action="version", version=f"pape-hub {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, text in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def command_parser(name: str) -> tuple[argparse.ArgumentParser, object]:
    module = importlib.import_module(f"pape_hub.commands.{name}")
    parser = argparse.ArgumentParser(prog=f"pape-hub {name}", description=module.__doc__,
                                     formatter_class=functools.partial(HelpFormatter, width=HELP_WIDTH))
    module.add_arguments(parser)
    return parser, module


def help_cache() -> Path | None:
    """``pape_hub/commands/help.json``, found without importing ``pape_hub`` (``find_spec`` runs no package code)."""
    spec = importlib.util.find_spec("pape_hub")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "commands" / "help.json"


def command_help(name: str) -> str:
    """What ``pape-hub NAME --help`` prints, rendered by the command's parser."""
    return command_parser(name)[0].format_help()


def python_minor() -> str:
    return "{}.{}".format(*sys.version_info[:2])


def write_help_cache() -> Path:
    """Render every command's help into :func:`help_cache` (``python scripts/write_cli_help.py``); argparse's
    layout differs between Python versions, so the file records the version that rendered it."""
    path = help_cache()
    cache = dict(python=python_minor(), commands={name: command_help(name) for name in COMMANDS})
    path.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    return path


def cached_help(name: str) -> str | None:
    """The cached help of command ``name``, if rendered by this Python version (else the parser renders it)."""
    path = help_cache()
    if path is None or not path.exists():
        return None
    cache = json.loads(path.read_text())
    return cache["commands"].get(name) if cache.get("python") == python_minor() else None


def _missing_extra(err: ImportError) -> str | None:
    try:
        from pape_hub import missing_extra
    except ImportError:  # pape_hub itself cannot be imported (torch or timm missing): say that instead
        return None
    return missing_extra(err)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    name = next((a for a in argv if not a.startswith("-")), None)
    if name is None or name not in COMMANDS:
        top_parser().parse_args(argv)  # --help / --version / a usage error naming the valid commands
        top_parser().print_help()
        return 2
    rest = argv[argv.index(name) + 1 :]
    if {"-h", "--help"} & set(rest) and (text := cached_help(name)) is not None:
        print(text, end="")  # the parser's own text, without importing torch, timm and transformers first
        return 0
    if name in LONG_COMMANDS and not {"-h", "--help"} & set(rest):  # at once: the imports take seconds
        print(f"pape-hub {name}: starting (importing torch, timm and the command's code)", flush=True)
    try:
        parser, module = command_parser(name)
        args = parser.parse_args(rest)
        args.command_line = [name, *rest]  # what results record as the command that wrote them
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print(f"pape-hub {name}: interrupted", file=sys.stderr)
        return 130
    except ImportError as err:  # an optional dependency: name the extra that installs it
        if debug:
            raise
        hint = _missing_extra(err)
        print(f"pape-hub {name}: error: {hint or err}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - the command line reports every failure in one line
        if debug:
            raise
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"pape-hub {name}: error: {message} ({type(err).__name__}; --debug shows the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
