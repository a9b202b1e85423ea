"""The `moelab` command: one subcommand per part, each part owning its own subcommands.

A part's `cli` module has `register(subparsers)`, adding its subcommands with a `func(args)`
that returns the exit status. Parts are imported here only for their argument parsers; heavy
imports (torch, cuda, streamlit) happen inside the commands. A bad input is one line on stderr
and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
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


# glibc's mallopt parameters, and what this process keeps: arrays up to 64 MB come from the heap,
# and up to 256 MB freed at its top stays there. With the defaults a 512-GPU routing handed each
# rank's 8 MB temporaries back and faulted them in again: 2 M page faults, 6 s of its 27.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BYTES, HEAP_ARRAY_BYTES = 256 << 20, 64 << 20


def keep_freed_memory() -> None:
    """Tell the C allocator to keep freed memory for the next arrays (glibc only; elsewhere nothing)."""
    libc = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(libc), "mallopt", None) if libc else None
    if mallopt is not None:
        mallopt(M_TRIM_THRESHOLD, KEEP_FREED_BYTES)
        mallopt(M_MMAP_THRESHOLD, HEAP_ARRAY_BYTES)


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
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # --help, --version or a usage error: argparse has printed it
        return e.code if isinstance(e.code, int) else 2
    from reference import ConfigError
    from reference.budget import BudgetError
    from reference.files import FileError

    keep_freed_memory()
    args.argv = argv  # the command as given, for what records it (moelab gpu's provenance)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, FileError, BudgetError) as e:
        print(f"moelab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"moelab {args.command}: interrupted", file=sys.stderr)
        return 130
