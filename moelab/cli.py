"""The `moelab` command: one subcommand per part, each part owning its own subcommands.

A part's `cli` module has `register(subparsers)`, adding its subcommands with a `func(args)`
that returns the exit status. Parts are imported here only for their argument parsers; heavy
imports (torch, cuda, streamlit) happen inside the commands. A bad input is one line on stderr
and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib import metadata

PARTS = ("reference.cli", "sim.cli", "app.cli", "gpu.cli")
EXIT_STATUS = ("exit status: 0 done, 1 a check failed or a bound was missed (where the command checks), "
               "2 a bad option, config or file, 130 interrupted.")


def version() -> str:
    try:
        return metadata.version("moelab")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


class Parser(argparse.ArgumentParser):
    """argparse's parser, but a usage error is one line (the subcommand's parsers are this too)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="moelab",
        description="Understand, predict and validate single-kernel distributed MoE: the golden "
                    "MoE, a discrete-event simulator, the real CUDA megakernel and a visualizer.",
        epilog=EXIT_STATUS,
    )
    p.add_argument("--version", action="version", version=f"moelab {version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in PARTS:
        importlib.import_module(name).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # --help, --version or a usage error: argparse has printed it
        return e.code if isinstance(e.code, int) else 2
    from reference import ConfigError
    from reference.budget import BudgetError
    from reference.files import FileError

    try:
        return int(args.func(args) or 0)
    except (ConfigError, FileError, BudgetError) as e:
        print(f"moelab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"moelab {args.command}: interrupted", file=sys.stderr)
        return 130
