"""The ``coalesce`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="coalesce",
        description="Coalesce concurrent per-item LLM calls into multi-item prompts.",
    )
    parser.add_argument("--version", action="version", version=f"coalesce {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser(
        "demo",
        help="tag 500 support tickets three ways and compare latency and cost",
        add_help=False,
    )
    commands.add_parser(
        "simulate",
        help="serve the simulated LLM provider over HTTP (see docs/testing.md)",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``coalesce`` command; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "demo":
        from ._demo import main as demo

        return demo(args[1:])
    if args and args[0] == "simulate":
        from .testing._cli import main as simulate

        return simulate(args[1:])
    parser = _parser()
    parser.parse_args(args)
    parser.print_help()
    return 0
