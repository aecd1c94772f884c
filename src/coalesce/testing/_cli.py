"""``coalesce simulate``: serve the simulated provider from the command line."""

from __future__ import annotations

import argparse
import math
import sys

from coalesce.exceptions import ConfigurationError

from ._config import load_config, provider_options
from ._degradation import PackingDegradation
from ._provider import SimulatedProvider
from ._server import bound_socket, stop_quietly

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``coalesce simulate``."""
    parser = argparse.ArgumentParser(
        prog="coalesce simulate",
        description="Serve a simulated OpenAI and Anthropic API on 127.0.0.1.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=_port, default=8000, help="port; 0 picks a free one (default 8000)"
    )
    parser.add_argument("--config", help="JSON (or TOML on Python 3.11+) configuration file")
    parser.add_argument(
        "--time-scale", type=_time_scale, help="override the configuration's time_scale"
    )
    parser.add_argument("--seed", type=int, help="override the configuration's seed")
    parser.add_argument(
        "--no-prompt-cache",
        action="store_true",
        help="simulate no prompt caching (default: as the providers cache)",
    )
    parser.add_argument(
        "--degradation",
        type=_degradation,
        metavar="KEY=VALUE,...",
        help="degrade packed answers, e.g. per_extra_item=0.02,per_position=0.01,free_items=4"
        " (keys: base, per_extra_item, per_position, free_items, seed); overrides the"
        " configuration's degradation",
    )
    return parser


#: The keys of ``--degradation`` and how each value is read.
_DEGRADATION_KEYS: dict[str, type[float] | type[int]] = {
    "base": float,
    "per_extra_item": float,
    "per_position": float,
    "free_items": int,
    "seed": int,
}


def _degradation(text: str) -> dict[str, float]:
    """``key=value`` pairs of :class:`PackingDegradation`, separated by commas (the
    values are checked when it is built)."""
    options: dict[str, float] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = (part.strip() for part in pair.partition("="))
        kind = _DEGRADATION_KEYS.get(key)
        if kind is None:
            known = ", ".join(_DEGRADATION_KEYS)
            raise argparse.ArgumentTypeError(f"unknown key {key!r} in {text!r}; use {known}")
        try:
            options[key] = kind(value)
        except ValueError:
            noun = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{key} must be {noun}, got {value!r}") from None
    return options


def _port(text: str) -> int:
    """A TCP port, 0 to 65535 (argparse reports the error in its own style)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer from 0 to 65535, got {text!r}"
        ) from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"must be from 0 to 65535 (0 picks a free one), got {port}"
        )
    return port


def _time_scale(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _provider(args: argparse.Namespace) -> SimulatedProvider:
    config = load_config(args.config) if args.config else {}
    options = provider_options(config)
    if args.time_scale is not None:
        options["time_scale"] = args.time_scale
    if args.seed is not None:
        options["seed"] = args.seed
    if args.no_prompt_cache:
        options["prompt_cache"] = False
    if args.degradation is not None:
        options["degradation"] = PackingDegradation(**args.degradation)
    return SimulatedProvider(**options)


def main(argv: list[str]) -> int:
    """Run the simulated provider until interrupted.

    Args:
        argv: The arguments after ``coalesce simulate`` (a leading ``"simulate"``
            is accepted too).

    Returns:
        The exit status: 0 after a clean stop, 2 on a configuration error (a bad argument
        exits with status 2 too, through argparse, with a one-line message).
    """
    if argv[:1] == ["simulate"]:
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    try:
        sim = _provider(args)
        import uvicorn

        sock = bound_socket(args.host, args.port)
    except ConfigurationError as exc:
        print(f"coalesce simulate: {exc}", file=sys.stderr)
        return 2
    except (TypeError, ValueError) as exc:  # a value of the wrong kind in the file
        print(f"coalesce simulate: invalid configuration in {args.config}: {exc}", file=sys.stderr)
        return 2
    except ImportError:
        print(
            "coalesce simulate needs uvicorn: pip install 'coalesce-llm[testing]'", file=sys.stderr
        )
        return 2
    except OSError as exc:
        print(
            f"coalesce simulate: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr
        )
        return 2
    sim.prepare()
    # Listening before the address is printed: a client that reads it and connects at
    # once waits in the backlog until uvicorn accepts, instead of being refused.
    sock.listen(2048)
    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}"
    print(f"coalesce simulated provider listening on {url}", flush=True)
    print(f"  OpenAI base_url: {url}/v1   Anthropic base_url: {url}", flush=True)
    config = uvicorn.Config(sim, log_level="warning", lifespan="off", access_log=False)
    with stop_quietly():
        uvicorn.Server(config).run(sockets=[sock])
    return 0
