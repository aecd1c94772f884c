"""Every option of coalesce, defined once (:data:`OPTIONS`), as httpx's ``_config.py``.

Each :class:`Option` has one name, default and meaning, and names the surfaces that take
it: ``prompt``, ``wrap``, ``serve`` (a flag, an environment variable, a ``--config``
key) and ``batch`` (``@coalesce.batch``, :class:`~coalesce.Batcher`); a surface that
defaults otherwise says why. ``tests/test_options.py`` holds the signatures, the
gateway's settings, the headers and the docs' tables to it. Where "not given" means
something of its own, the default is :data:`NOT_GIVEN` (openai-python's sentinel).
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, cast, final, get_args

from ._exceptions import ConfigurationError, UnknownOptionError
from ._validate import check_callable, check_int, check_seconds

__all__ = [
    "BATCH_MAX_ITEMS",
    "BATCH_MAX_WAIT",
    "BUDGET_WAIT_SHARE",
    "IN_MEMORY",
    "LANE_CHOICES",
    "LEARNED_CAP_CEILING",
    "MAX_ATTEMPTS",
    "MAX_RETRIES",
    "NOT_GIVEN",
    "OPTION",
    "OPTIONS",
    "POLL_INTERVAL",
    "PROMPT_MAX_ITEMS",
    "REQUEST_TIMEOUT",
    "SHADOW",
    "LaneChoice",
    "NotGiven",
    "Option",
    "on",
    "refuse_unknown",
    "refuses_unknown",
    "wait_for_company",
]


@final
class NotGiven:
    """The default of an option whose absence means something of its own; its one
    instance, ``coalesce.NOT_GIVEN``, is falsy. ``max_items``: the cap is learned (given,
    even 4, it is pinned); ``max_wait``: 0.05 s, or a quarter of a call's budget;
    ``shadow``: 0.01 where the cap is learned (given, on every function)."""

    def __bool__(self) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        return "NOT_GIVEN"

    def __reduce__(self) -> str:  # copies and pickles are the one instance
        return "NOT_GIVEN"


NOT_GIVEN: Final = NotGiven()

#: ``store=":memory:"`` (or ``COALESCE_STORE=:memory:``): nothing is written to disk.
IN_MEMORY: Final = ":memory:"

# -- the defaults that say why --------------------------------------------------------

#: ``batch``: a 10 ms window, a small, bounded wait added to each call for the chance
#: to share a batch's fixed cost (a query, a model's forward pass).
BATCH_MAX_WAIT = 0.01
#: ``batch``: 64 items amortise a batch's fixed cost; one failure touches few callers.
BATCH_MAX_ITEMS = 64
#: An LLM call takes seconds: a 50 ms window bounds its added wait where no latency
#: budget says how much waiting the caller accepts.
PROMPT_MAX_WAIT = 0.05
#: With a latency budget and ``max_wait`` not given, a call waits for company at most a
#: quarter of its budget; the planner still sends a group earlier when waiting longer
#: would make a member late. Measured (bench_cap, 100 calls/s, 2 s budget, the cap
#: learned): 0.05 s windows hold 5-6 calls, 0.28x of plain calls' prompt tokens; a
#: quarter of the budget, 7 calls, 0.249x, 100% within budget. A larger share leaves the
#: reply too little of the budget at low rates.
BUDGET_WAIT_SHARE = 0.25
#: Group size is an accuracy decision as well as a latency one: measured here
#: (docs/accuracy.md), 4 is the largest group that stays near plain calls for labels
#: and extracted values alike on a small model; 8 is worse. With ``max_items`` not
#: given, the cap starts here and is learned per model and function.
PROMPT_MAX_ITEMS = 4
#: The most items a learned cap reaches: hosted models stay about as accurate as single
#: calls up to 6-32 items (Cheng et al. 2023; BatchPrompt, batch 32), and a 2 s budget
#: rarely fits a larger group's answers.
LEARNED_CAP_CEILING = 32
#: A missing or invalid answer is asked again a bounded number of times: one poison
#: item costs little.
MAX_ATTEMPTS = 4
#: Retries of a request that failed as a whole, never past the callers' budget.
MAX_RETRIES = 4
#: Longest one request attempt may run when no latency budget bounds it.
REQUEST_TIMEOUT = 60.0
POLL_INTERVAL = 60.0
#: 1% of packed items asked again alone where the cap is learned: at a learned cap's
#: ~0.24x of plain calls' prompt tokens it adds about 0.01x, and at 100 calls/s it
#: still judges a size within a minute (learning shadows more for a bounded while).
SHADOW = 0.01

#: The annotation of ``lane=``; :data:`LANE_CHOICES` are its values.
LaneChoice = Literal["auto", "realtime", "flex", "batch"]
LANE_CHOICES: tuple[str, ...] = get_args(LaneChoice)


def wait_for_company(max_wait: float | NotGiven, latency_budget: float | None) -> float:
    """The window: ``max_wait`` as given; not given, a quarter of the latency budget
    (:data:`BUDGET_WAIT_SHARE`) when there is one, else :data:`PROMPT_MAX_WAIT`."""
    if not isinstance(max_wait, NotGiven):
        return float(max_wait)
    return PROMPT_MAX_WAIT if latency_budget is None else latency_budget * BUDGET_WAIT_SHARE


# -- the checks: each raises ConfigurationError naming the option and what is valid -----

Check = Callable[..., object]


def _flag(name: str, value: Any, optional: bool = False) -> None:
    if not isinstance(value, bool) and not (optional and value is None):
        kinds = "True, False or None" if optional else "True or False"
        raise ConfigurationError(f"{name} must be {kinds}, got {value!r}")


def _fraction(name: str, value: Any, optional: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        hint = " (shadow=0.02 asks 2% of packed items again alone)" if name == "shadow" else ""
        raise ConfigurationError(f"{name} must be a fraction from 0 to 1, got {value!r}{hint}")


def _choice(*values: str) -> Check:
    def check(name: str, value: Any, optional: bool = False) -> None:
        if value not in values:
            shown = list(map(repr, values))
            allowed = " or ".join(shown) if len(values) == 2 else "one of " + ", ".join(shown)
            raise ConfigurationError(f"{name} must be {allowed}, got {value!r}")

    return check


def _callable(name: str, value: Any, optional: bool = True) -> None:
    check_callable(name, value)


def _flag_or_callable(name: str, value: Any, optional: bool = False) -> None:
    if not isinstance(value, bool):
        check_callable(name, value)


_POSITIVE: Check = partial(check_seconds, positive=True)

# -- the catalogue ----------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One option.

    Attributes:
        name: Its keyword.
        default: Its value when not given.
        on: The surfaces that take it, space-separated.
        meaning: What it does, in a line (also its flag's ``--help``).
        check: Raises :class:`~coalesce.ConfigurationError` for a value it refuses,
            called as ``check(name, value, optional=...)``.
        differs: By surface, its default there and why that surface differs.
        header: The request header that sets it for one call (``wrap``, ``serve``).
        kind: How ``coalesce serve`` reads it from text (a flag, a variable).
        setting: Its name in ``coalesce serve``'s settings (default: ``name``).
        flag: Its flag (``serve`` only; default: ``--`` and the setting, dashed).
        variable: Its environment variable (``serve`` only; ``COALESCE_`` and the setting).
    """

    name: str
    default: Any
    on: str
    meaning: str
    check: Check | None = None
    differs: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    header: str | None = None
    kind: Callable[[str], Any] = str
    setting: str = ""
    flag: str = ""
    variable: str = ""

    def __post_init__(self) -> None:
        if "serve" in self.on.split():
            setting = self.setting or self.name
            object.__setattr__(self, "setting", setting)
            object.__setattr__(self, "flag", self.flag or "--" + setting.replace("_", "-"))
            object.__setattr__(self, "variable", self.variable or "COALESCE_" + setting.upper())

    def default_on(self, surface: str) -> Any:
        """Its default on ``surface``."""
        return self.differs[surface][0] if surface in self.differs else self.default

    def validate(self, value: Any, name: str = "", *, optional: bool | None = None) -> None:
        """Check ``value``, named ``name`` (default: the option's): :data:`NOT_GIVEN`
        passes, and so does ``None`` where it is the default, unless ``optional`` is false.

        Raises:
            ConfigurationError: The option refuses it.
        """
        if self.check is not None and value is not NOT_GIVEN:
            optional = self.default is None if optional is None else optional
            self.check(name or self.name, value, optional=optional)


_LLM = "prompt wrap"
_SHARED = "prompt wrap serve"
_BATCH = "a batch's fixed cost (a query, a forward pass) takes milliseconds, an LLM call seconds"

# fmt: off
#: Every option: ``prompt``'s in the order of its signature, then the gateway's and the
#: batcher's own.
OPTIONS: tuple[Option, ...] = (
    Option("client", None, "prompt", "an AsyncOpenAI, AsyncAnthropic, Provider or async callable"),
    Option("model", None, "prompt", "the model name (required)"),
    Option("instructions", None, "prompt", "the shared instructions (default: the docstring)"),
    Option("max_wait", NOT_GIVEN, _SHARED + " batch", "longest a call waits for company, in"
           " seconds (not given: 0.05, or a quarter of its latency budget)", check_seconds,
           {"batch": (BATCH_MAX_WAIT, _BATCH + ", with no budget to share")}, kind=float),
    Option("max_items", NOT_GIVEN, _SHARED + " batch", "most calls per request (not given:"
           " learned from 4; given, it pins the cap)", check_int,
           {"batch": (BATCH_MAX_ITEMS, _BATCH + ", and packing costs no accuracy")}, kind=int),
    Option("max_concurrency", None, _LLM + " batch", "most requests in flight", check_int),
    Option("latency_budget", None, _SHARED, "seconds a call may take end to end", _POSITIVE,
           header="x-coalesce-budget", kind=float, setting="budget"),
    Option("partition", None, _LLM + " batch", "calls of different keys never share a request",
           _callable, header="x-coalesce-partition"),
    Option("max_attempts", MAX_ATTEMPTS, _LLM, "requests that may carry one item", check_int),
    Option("max_retries", MAX_RETRIES, _SHARED, "retries of an upstream request that failed"
           " as a whole (429, 5xx, timeouts)", partial(check_int, minimum=0),
           {"wrap": (None, "the wrapped client's own max_retries: a drop-in keeps what the"
                     " client was configured with"),
            "serve": (0, "the clients' SDKs retry already; the gateway leaves it to them")},
           kind=int),
    Option("max_output_tokens", None, _LLM, "cap on each reply's tokens", check_int),
    Option("stream", True, "prompt", "answer each caller as its own output streams in", _flag),
    Option("dedupe", False, "prompt", "identical items in one group share one slot", _flag),
    Option("expected_output_tokens", None, "prompt", "output tokens per item, at first", check_int),
    Option("latency_prior", None, _LLM, "what the planner assumes of the provider at first"),
    Option("token_estimator", None, "prompt", "counts input tokens (None: tiktoken)"),
    Option("prices", None, _LLM, "prices for the cost estimates and packing's cost decision"),
    Option("on_event", None, _LLM, "called with each call, request and retry event", _callable),
    Option("timeout", None, _LLM, "longest one request attempt may run, in seconds (None:"
           " the budget, else the client's timeout, else 60)", _POSITIVE),
    Option("context_window", None, _LLM, "the model's context window in tokens", check_int),
    Option("schema_enforced", None, _LLM, "whether replies always follow the schema", _flag),
    Option("packing", "auto", _LLM, "where to pack: 'auto' or 'always'", _choice("auto", "always")),
    Option("lane", "auto", _SHARED, "where calls go: 'auto' (by each call's budget),"
           " 'realtime', 'flex' or 'batch'", _choice(*LANE_CHOICES),
           {"wrap": ("realtime", "a drop-in client's caller waits on its SDK's timeout,"
                     " which a deferred lane would outlast")}, header="x-coalesce-lane"),
    Option("store", None, _SHARED, "the job store file, the learned caps beside it (':memory:':"
           " no file)", kind=Path),
    # A minute of deferred calls shares one job; a minute is nothing next to a batch
    # job's 24 h window.
    Option("batch_window", 60.0, _SHARED, "seconds a deferred (flex, batch) call"
           " waits for others", check_seconds, kind=float),
    Option("batch_client", None, "prompt", "the client of the deferred lanes (None: client)"),
    Option("poll_interval", POLL_INTERVAL, _SHARED, "longest wait between two polls of a"
           " batch job, in seconds", _POSITIVE, kind=float),
    Option("shadow", NOT_GIVEN, _LLM, "share of packed items also asked alone (not given:"
           " 0.01 where the cap is learned)", _fraction),
    Option("min_agreement", 0.9, _LLM, "agreement under which the cap falls", _fraction),
    Option("agree", None, _LLM, "agree(packed, plain) -> bool (None: ==, free text by its words)", _callable),
    Option("vote", False, _LLM, "ask each packed group in two orders", _flag),
    Option("screen", True, _LLM, "a call whose item reads like instructions goes alone",
           _flag_or_callable),
    # coalesce serve's own
    Option("host", "127.0.0.1", "serve", "the interface to bind"),
    Option("port", 8080, "serve", "the port; 0 picks a free one", kind=int),
    Option("openai_upstream", "https://api.openai.com/v1", "serve", "OpenAI's base URL"),
    Option("anthropic_upstream", "https://api.anthropic.com", "serve", "Anthropic's base URL"),
    Option("upstream_timeout", 600.0, "serve", "seconds an upstream request may run", _POSITIVE,
           kind=float),
    Option("max_body_size", 16 * 1024 * 1024, "serve", "largest body of a coalesced call,"
           " in bytes", check_int, kind=int),
    Option("api_keys", (), "serve", "a key clients must present (repeatable)", flag="--api-key"),
    Option("graceful_timeout", 30.0, "serve", "seconds a stopping gateway waits for calls in"
           " flight", check_seconds, kind=float),
    Option("log_level", "info", "serve", "how much", _choice("debug", "info", "warning", "error")),
    # the fleet (docs/fleet.md)
    Option("fleet", None, _SHARED, "a NATS URL: the processes given the same one coalesce as"
           " one (docs/fleet.md)"),
    Option("fleet_creds", None, _SHARED, "a NATS credentials file the fleet connects with",
           kind=Path),
    Option("fleet_tls_ca", None, _SHARED, "a CA bundle the fleet's NATS server is verified"
           " with (TLS)", kind=Path),
    Option("workers", 1, "serve", "processes that take calls and coalesce as one, over the"
           " fleet (an embedded NATS server when no fleet is given)", check_int, kind=int),
    # the batcher's own
    Option("max_pending", None, "batch", "most items accepted but not yet dispatched", check_int),
    Option("size", None, "batch", "size(item) -> weight, with max_size", _callable),
    Option("max_size", None, "batch", "most total weight per batch",
           partial(check_seconds, positive=True, unit="size units")),
    Option("name", None, "batch", "the batcher's name in messages (None: the function's)"),
    Option("policy", None, "batch", "consulted before and after each item joins a window"),
    Option("on_dispatch", None, "batch", "called with each batch's reason and items", _callable),
    Option("resolve_early", False, "batch", "fn(items, resolve) may answer callers at once"),
)
# fmt: on

OPTION: Mapping[str, Option] = {option.name: option for option in OPTIONS}


def on(surface: str) -> tuple[Option, ...]:
    """The options ``surface`` takes."""
    return tuple(option for option in OPTIONS if surface in option.on.split())


def refuse_unknown(
    where: str, given: Iterable[str], known: Collection[str], *, cutoff: float = 0.6
) -> None:
    """Refuse the first of ``given`` not in ``known``, with the closest option named.

    Raises:
        UnknownOptionError: One is unknown.
    """
    for name in given:
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=cutoff)
        hint = f"did you mean {close[0]!r}?" if close else f"{where} takes {', '.join(known)}"
        raise UnknownOptionError(f"unknown option {name!r}: {hint}")


F = TypeVar("F", bound=Callable[..., Any])
_KEYWORDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def refuses_unknown(where: str) -> Callable[[F], F]:
    """Make the entry point ``where`` refuse a keyword it does not take with
    :func:`refuse_unknown`'s error (naming the closest) instead of a bare ``TypeError``."""

    def decorate(fn: F) -> F:
        parameters = inspect.signature(fn).parameters.values()
        known = [p.name for p in parameters if p.kind in _KEYWORDS and p.name != "self"]

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            refuse_unknown(where, kwargs, known)
            return fn(*args, **kwargs)

        return cast(F, checked)

    return decorate
