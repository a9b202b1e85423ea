"""The `moelab` command: one subcommand per part, each part owning its own subcommands.

A part's `cli` module has `register(subparsers)`, adding its subcommands with a `func(args)`
that returns the exit status. Parts are imported here only for their argument parsers; heavy
imports (torch, cuda, streamlit) happen inside the commands.
"""

from __future__ import annotations

import argparse
import importlib
import sys

PARTS = ("reference.cli", "sim.cli", "app.cli", "gpu.cli")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="moelab",
        description="Understand, predict and validate single-kernel distributed MoE: the golden "
                    "MoE, a discrete-event simulator, the real CUDA megakernel and a visualizer.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in PARTS:
        importlib.import_module(name).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from reference import ConfigError

    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"moelab {args.command}: error: {e}", file=sys.stderr)
        return 2
