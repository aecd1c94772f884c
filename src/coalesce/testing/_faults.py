"""Faults: what can go wrong with a request, chosen by probability or by script.

:class:`FaultPlan` is the configuration; :class:`FaultSource` hands out the faults of
each request (the next scripted entry first, then a seeded draw). The transforms that
damage a reply (:func:`damage_results`, :func:`damage_text`) are pure.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from coalesce.exceptions import ConfigurationError

from ._model import expected_output

__all__ = [
    "FAULT_STATUS",
    "HTTP_FAULTS",
    "ITEM_FAULTS",
    "TEXT_FAULTS",
    "Fault",
    "FaultPlan",
    "FaultSource",
    "FaultSpec",
    "choose_fault",
    "damage_results",
    "damage_text",
    "parse_faults",
    "wrong_output",
]


class Fault(str, enum.Enum):
    """A fault the simulated provider can inject into one request."""

    RATE_LIMIT = "rate_limit"
    """A 429 with ``retry-after``, as if the rate limit were hit."""
    SERVER_ERROR = "server_error"
    """A 500."""
    UNAVAILABLE = "unavailable"
    """A 503 (the provider is overloaded)."""
    HANG = "hang"
    """No answer for :attr:`FaultPlan.hang_seconds`: past any sensible client timeout."""
    DISCONNECT = "disconnect"
    """The connection drops in the middle of the answer (streamed or not)."""
    MALFORMED_JSON = "malformed_json"
    """The reply is not valid JSON."""
    PROSE = "prose"
    """The JSON reply is wrapped in chatty prose."""
    CODE_FENCE = "code_fence"
    """The JSON reply is wrapped in a Markdown code fence."""
    TRUNCATE = "truncate"
    """The reply stops half way, with ``finish_reason: length``."""
    MISSING_ITEM = "missing_item"
    """One item of a packed reply has no result."""
    EXTRA_ID = "extra_id"
    """A packed reply carries a result for an id nobody asked about."""
    DUPLICATE_ID = "duplicate_id"
    """An id appears twice in a packed reply, the second time with another output."""
    DUPLICATE_ID_WRONG_FIRST = "duplicate_id_wrong_first"
    """An id appears twice in a packed reply, first with a wrong output, then with its
    right one: what a provider that ignores the reply schema can write, and what a
    streamed answer delivered at its first occurrence gets wrong."""
    OUT_OF_ORDER = "out_of_order"
    """A packed reply lists its results in another order than the request."""


#: The HTTP status of each fault that answers with an error instead of a reply.
FAULT_STATUS: Mapping[Fault, int] = {
    Fault.RATE_LIMIT: 429,
    Fault.SERVER_ERROR: 500,
    Fault.UNAVAILABLE: 503,
}
HTTP_FAULTS = frozenset(FAULT_STATUS)
TEXT_FAULTS = frozenset({Fault.MALFORMED_JSON, Fault.PROSE, Fault.CODE_FENCE})
ITEM_FAULTS = frozenset(
    {
        Fault.MISSING_ITEM,
        Fault.EXTRA_ID,
        Fault.DUPLICATE_ID,
        Fault.DUPLICATE_ID_WRONG_FIRST,
        Fault.OUT_OF_ORDER,
    }
)
#: Where each duplicating fault puts the wrong twin: after (1) or before (0) the original.
_TWIN_OFFSET: Mapping[Fault, int] = {Fault.DUPLICATE_ID: 1, Fault.DUPLICATE_ID_WRONG_FIRST: 0}

#: One scripted request: no fault, one fault, or several (by enum or by name).
FaultSpec: TypeAlias = "Fault | str | Iterable[Fault | str] | None"


def parse_faults(spec: FaultSpec) -> frozenset[Fault]:
    """Return the faults one scripted entry names: ``None``, a :class:`Fault`, its name
    (``"rate_limit"``), or several.

    Raises:
        ConfigurationError: A name is not a fault.
    """
    if spec is None:
        return frozenset()
    names: Iterable[Fault | str] = [spec] if isinstance(spec, (Fault, str)) else spec
    faults = set()
    for name in names:
        try:
            faults.add(Fault(name))
        except ValueError:
            allowed = ", ".join(f.value for f in Fault)
            raise ConfigurationError(f"unknown fault {name!r}; choose from {allowed}") from None
    return frozenset(faults)


@dataclass(frozen=True)
class FaultPlan:
    """Which faults to inject.

    Attributes:
        probabilities: Chance of each fault per request, e.g.
            ``{"server_error": 0.05, "missing_item": 0.1}``; at most one fault is
            drawn per request, so the chances must add up to at most 1.
        script: One entry per request, consumed in order before any draw: ``None``
            (no fault), a fault, or a list of faults for that one request.
        seed: Seed of the draws (and of which item a fault hits).
        hang_seconds: How long a ``hang`` lasts, before the time scale;
            ``math.inf`` (``Infinity`` in a JSON configuration) never answers, until
            the client gives up.
    """

    probabilities: Mapping[Fault | str, float] = field(default_factory=dict)
    script: Sequence[FaultSpec] = ()
    seed: int = 0
    hang_seconds: float = 3600.0

    def __post_init__(self) -> None:
        chances = self.chances()
        if any(p < 0 for p in chances.values()) or sum(chances.values()) > 1 + 1e-9:
            raise ConfigurationError(
                f"fault probabilities must be >= 0 and add up to at most 1, got {dict(chances)}"
            )
        for entry in self.script:
            parse_faults(entry)
        if not self.hang_seconds >= 0:  # also refuses NaN
            raise ConfigurationError(
                f"hang_seconds must be >= 0 (math.inf: never answer), got {self.hang_seconds!r}"
            )

    def chances(self) -> dict[Fault, float]:
        """Return :attr:`probabilities` keyed by :class:`Fault`."""
        return {next(iter(parse_faults(name))): float(p) for name, p in self.probabilities.items()}


def choose_fault(chances: Mapping[Fault, float], draw: float) -> Fault | None:
    """Return the fault a uniform ``draw`` in ``[0, 1)`` lands on, given each fault's
    ``chances``, if any."""
    edge = 0.0
    for fault, chance in chances.items():
        edge += chance
        if draw < edge:
            return fault
    return None


class FaultSource:
    """Hands out the faults of each request: scripted entries first, then draws."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self._chances = plan.chances()
        self._script: deque[frozenset[Fault]] = deque(parse_faults(e) for e in plan.script)

    def inject(self, *requests: FaultSpec) -> None:
        """Script the faults of the next requests, one argument per request.

        Args:
            requests: For each coming request, ``None`` or one or more faults.
        """
        self._script.extend(parse_faults(spec) for spec in requests)

    @property
    def pending(self) -> int:
        """How many scripted entries are still to be consumed."""
        return len(self._script)

    def next(self) -> frozenset[Fault]:
        """Return the faults of the next request."""
        if self._script:
            return self._script.popleft()
        if not self._chances:
            return frozenset()
        fault = choose_fault(self._chances, self.rng.random())
        return frozenset() if fault is None else frozenset({fault})


def wrong_output(original: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> Any:
    """Return another answer than ``original["output"]``, valid under ``schema``.

    A wrong answer that breaks the schema would be caught by validation; this one is
    caught only by noticing the id was written twice.
    """
    candidate: Any = None
    for attempt in range(8):  # a small enum may draw the right answer again
        candidate = expected_output({"duplicate": dict(original), "attempt": attempt}, schema)
        if candidate != original["output"]:
            break
    return candidate


def damage_results(
    results: list[dict[str, Any]],
    faults: frozenset[Fault],
    rng: random.Random,
    schema: Mapping[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], frozenset[Fault]]:
    """Apply the item-level faults to a packed reply's results.

    Args:
        results: ``[{"id": ..., "output": ...}, ...]`` in request order.
        faults: The request's faults; only :data:`ITEM_FAULTS` matter here.
        rng: Chooses which item a fault hits.
        schema: The JSON schema of one item's output: a duplicate's wrong twin
            follows it.

    Returns:
        The damaged results and the faults that actually applied.
    """
    applied = set()
    out = list(results)
    for fault, offset in _TWIN_OFFSET.items():
        if fault in faults and out:
            index = rng.randrange(len(out))
            original = out[index]
            twin = {"id": original["id"], "output": wrong_output(original, schema)}
            out.insert(index + offset, twin)
            applied.add(fault)
    if Fault.MISSING_ITEM in faults and out:
        out.pop(rng.randrange(len(out)))
        applied.add(Fault.MISSING_ITEM)
    if Fault.EXTRA_ID in faults:
        extra = f"extra-{rng.randrange(16**8):08x}"
        out.insert(rng.randrange(len(out) + 1), {"id": extra, "output": expected_output(extra)})
        applied.add(Fault.EXTRA_ID)
    if Fault.OUT_OF_ORDER in faults and len(out) > 1:
        shuffled = list(out)
        rng.shuffle(shuffled)
        out = shuffled if shuffled != out else out[::-1]
        applied.add(Fault.OUT_OF_ORDER)
    return out, frozenset(applied)


def damage_text(text: str, faults: frozenset[Fault]) -> tuple[str, frozenset[Fault]]:
    """Apply the text-level faults (:data:`TEXT_FAULTS`) to a reply; return the damaged
    text and the faults that actually applied."""
    applied = faults & TEXT_FAULTS
    if Fault.MALFORMED_JSON in faults:
        # A key loses its quotes and the closing brace is gone: no JSON parser takes it.
        text = text.replace('{"', "{", 1).replace('":', ":", 1).rstrip("}]") + ","
    if Fault.CODE_FENCE in faults:
        text = f"```json\n{text}\n```"
    if Fault.PROSE in faults:
        text = f"Sure! Here are the results you asked for:\n\n{text}\n\nLet me know if you need anything else."
    return text, applied
