"""The ``coalesce`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__
from ._exceptions import ConfigurationError

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
        help="tag 500 support tickets four ways and compare latency and cost",
        add_help=False,
    )
    commands.add_parser(
        "simulate",
        help="serve the simulated LLM provider over HTTP (see docs/testing.md)",
        add_help=False,
    )
    commands.add_parser(
        "serve",
        help="serve an OpenAI- and Anthropic-compatible gateway that coalesces every client's"
        " calls (see docs/gateway.md)",
        add_help=False,
    )
    commands.add_parser(
        "jobs",
        help="list, show, wait for, cancel and resume the batch lane's jobs; write their results",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``coalesce`` command; returns the process exit code.

    A bad argument ends it with a one-line message and exit code 2, as argparse does,
    never with a traceback.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("demo", "jobs", "serve", "simulate"):
        try:
            return _command(args[0], args[1:])
        except ConfigurationError as exc:  # a value argparse let through (inf, nan...)
            print(f"coalesce {args[0]}: error: {exc}", file=sys.stderr)
            return 2
    parser = _parser()
    parser.parse_args(args)
    parser.print_help()
    return 0


def _command(name: str, argv: list[str]) -> int:
    if name == "demo":
        from ._demo import main as demo

        return demo(argv)
    if name == "jobs":
        from ._lanes.jobs_cli import main as jobs

        return jobs(argv)
    if name == "serve":
        from ._gateway.server import main as serve

        return serve(argv)
    from .testing._cli import main as simulate

    return simulate(argv)
