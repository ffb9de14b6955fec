"""The ``pape-hub`` command line (and, through :class:`CommandLine`, this repository's ``python -m lab``).

This module lives beside the ``pape_hub`` package, not in it: ``import pape_hub`` registers every model with timm
(seconds of imports: torch, torchvision, timm), and ``pape-hub --help`` / ``--version`` should not pay for that. A
command's module is imported only once that command is chosen. Each command is described once: a one-line summary
here, and the details and examples in its module's docstring, which its ``--help`` shows under the summary.

``pape-hub COMMAND --help`` renders the command's parser once and keeps the text in a per-user cache
(``$XDG_CACHE_HOME/pape_hub``, default ``~/.cache/pape_hub``), keyed by the Python version and by the size and
modification time of every file of the package, so an edited command never shows stale help; later calls print it
without importing torch.

Errors print one line naming the problem (``--debug`` anywhere on the line shows the traceback instead).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["COMMANDS", "CommandLine", "HelpFormatter", "PAPE_HUB", "main"]
HELP_WIDTH = 100  # help is rendered at one width, so the cached text is the parser's own
HELP_CACHE_LIMIT = 1 << 20  # bytes: every command's help together is about 40 kB

#: the installed commands, each described here once (the details are in the command module's docstring)
COMMANDS = {
    "train": "train a model (accelerate) on a built-in task, an image or video dataset, point clouds or events",
    "eval": "evaluate a checkpoint across sizes (with and without position interpolation), point counts or speeds",
    "convert": "a public ImageNet checkpoint (pape_hub.list_pretrained()) as a checkpoint folder with its card",
    "push": "upload a checkpoint folder (weights, config, code, model card, results) to the Hub",
    "card": "write a checkpoint's model card from its results JSON",
}


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


def _missing_extra(err: ImportError) -> str | None:
    try:
        from pape_hub import missing_extra
    except ImportError:  # pape_hub itself cannot be imported (torch or timm missing): say that instead
        return None
    return missing_extra(err)


@dataclass(frozen=True)
class CommandLine:
    """A command line of lazily imported commands: ``commands`` (name -> one-line summary) live as modules of
    ``package``, each with ``add_arguments(parser)`` and ``run(args)``; ``long`` commands say at once that they
    started, before the seconds their imports take."""

    prog: str
    description: str
    commands: dict[str, str]
    package: str
    long: tuple[str, ...] = ()

    def top_parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=self.prog, formatter_class=HelpFormatter, description=self.description,
                                         epilog=f"`{self.prog} COMMAND --help` describes a command. Add --debug "
                                         "anywhere for a full traceback on error.")
        parser.add_argument("--version", action="version", version=f"{self.prog} {package_version()}")
        sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
        for name, text in self.commands.items():
            sub.add_parser(name, help=text, add_help=False)
        return parser

    def command_parser(self, name: str) -> tuple[argparse.ArgumentParser, object]:
        module = importlib.import_module(f"{self.package}.{name}")
        details = (module.__doc__ or "").strip()
        parser = argparse.ArgumentParser(prog=f"{self.prog} {name}", description=f"{self.commands[name]}.\n\n{details}",
                                         formatter_class=functools.partial(HelpFormatter, width=HELP_WIDTH))
        module.add_arguments(parser)
        return parser, module

    def help_cache(self) -> Path | None:
        """The cache file of this Python version and the package's files as they are now, the library's included
        (a command's help reads its settings from there); None: not found."""
        roots = []
        for package in dict.fromkeys([self.package.split(".")[0], "pape_hub"]):
            spec = importlib.util.find_spec(package)  # runs no package code
            if spec is None or not spec.submodule_search_locations:
                return None
            roots.append(Path(list(spec.submodule_search_locations)[0]))
        files = sorted([*(f for root in roots for f in root.rglob("*.py")), Path(__file__)])
        stamp = ";".join(f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
        key = hashlib.sha256(f"{sys.version_info[:2]};{self.prog};{stamp}".encode()).hexdigest()[:16]
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pape_hub"
        return cache / f"help-{self.package}-{key}.json"

    def read_help_cache(self, path: Path | None) -> dict[str, str]:
        """The cached texts: a file this program wrote (a JSON object of strings, under :data:`HELP_CACHE_LIMIT`
        bytes); anything else is ignored and replaced on the next write."""
        try:
            if path is None or not path.is_file() or path.stat().st_size > HELP_CACHE_LIMIT:
                return {}
            cached = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(cached, dict):
            return {}
        return {k: v for k, v in cached.items() if isinstance(k, str) and isinstance(v, str)}

    def command_help(self, name: str) -> str:
        """What ``PROG NAME --help`` prints: the cached text, else the parser's (then cached for next time). Text
        from the cache is printed without control characters (a terminal escape sequence in it does nothing)."""
        path = self.help_cache()
        cached = self.read_help_cache(path)
        if name in cached:
            return "".join(c for c in cached[name] if c in "\n\t" or c >= " ")
        text = self.command_parser(name)[0].format_help()
        if path is not None and not path.is_dir():
            tmp = None
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".help-")
                with os.fdopen(fd, "w") as fh:
                    json.dump({**cached, name: text}, fh)
                os.replace(tmp, path)
            except OSError:  # a read-only home: no cache, the parser renders it every time
                if tmp is not None and os.path.exists(tmp):
                    os.unlink(tmp)
        return text

    def main(self, argv: list[str] | None = None) -> int:
        argv = list(sys.argv[1:] if argv is None else argv)
        debug = "--debug" in argv
        argv = [a for a in argv if a != "--debug"]
        name = next((a for a in argv if not a.startswith("-")), None)
        if name is None or name not in self.commands:
            self.top_parser().parse_args(argv)  # --help / --version / a usage error naming the valid commands
            self.top_parser().print_help()
            return 2
        rest = argv[argv.index(name) + 1:]
        asked = next((i for i, a in enumerate(rest) if a in ("-h", "--help")), None)
        # the command's own help (cached); after a sub-action or positional first (`hub serve --help`) the parser
        # prints that one's
        if asked is not None and (asked == 0 or rest[0].startswith("-")):
            try:
                print(self.command_help(name), end="")
            except ImportError as err:  # a core-only install: name the extra the command needs
                print(f"{self.prog} {name}: error: {_missing_extra(err) or err}", file=sys.stderr)
                return 1
            return 0
        if name in self.long:  # at once: the imports take seconds
            print(f"{self.prog} {name}: starting (importing torch, timm and the command's code)", flush=True)
        try:
            parser, module = self.command_parser(name)
            args = parser.parse_args(rest)
            args.command_line = [name, *rest]  # what results record as the command that wrote them
            return int(module.run(args) or 0)
        except KeyboardInterrupt:
            print(f"{self.prog} {name}: interrupted", file=sys.stderr)
            return 130
        except ImportError as err:  # an optional dependency: name the extra that installs it
            if debug:
                raise
            print(f"{self.prog} {name}: error: {_missing_extra(err) or err}", file=sys.stderr)
            return 1
        except Exception as err:  # noqa: BLE001 - the command line reports every failure in one line
            if debug:
                raise
            message = " ".join(str(err).split()) or type(err).__name__
            print(f"{self.prog} {name}: error: {message} ({type(err).__name__}; --debug shows the traceback)",
                  file=sys.stderr)
            return 1


PAPE_HUB = CommandLine(
    prog="pape-hub", description="pape_hub: every modern vision position encoding in timm and transformers ViTs and "
    "ViViTs.", commands=COMMANDS, package="pape_hub.commands", long=("train", "eval", "convert"))


def main(argv: list[str] | None = None) -> int:
    return PAPE_HUB.main(argv)


if __name__ == "__main__":
    sys.exit(main())
