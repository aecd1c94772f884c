"""Output tokens per answer: what to expect before any reply, and what replies teach.

:func:`expected_output_tokens` is the one rule for an answer's size before any reply
was measured (declared, else bounded by the output type, else a default); the
estimates below start from it and learn from the sizes replies report.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Protocol, runtime_checkable

from coalesce._batching.quantile import WindowQuantile
from coalesce._exceptions import ConfigurationError

from .longest import bounded_output_tokens
from .tokens import TokenEstimator

__all__ = [
    "DEFAULT_EXPECTED_OUTPUT_TOKENS",
    "REQUEST_HEADROOM",
    "FixedOutputTokens",
    "OutputTokenEstimate",
    "OutputTokenRegistry",
    "OutputTokenTracker",
    "expected_output_tokens",
    "request_output_cap",
]

#: Output tokens per answer assumed before any reply, when neither the function nor its
#: output type says more.
DEFAULT_EXPECTED_OUTPUT_TOKENS = 50


def expected_output_tokens(
    schema: Mapping[str, Any], estimator: TokenEstimator, declared: int | None
) -> int:
    """The tokens one answer is expected to take before any reply was measured.

    The declared size wins; else the longest answer ``schema`` allows (a
    classification's label, see :func:`~coalesce._planning.longest.bounded_output_tokens`);
    else :data:`DEFAULT_EXPECTED_OUTPUT_TOKENS`. A declared or bounded size of 0 counts
    as not given (an answer is never free).

    Args:
        schema: The JSON schema of one answer.
        estimator: Counts the tokens of the bounded answer.
        declared: The function's ``expected_output_tokens``, if set.
    """
    return declared or bounded_output_tokens(schema, estimator) or DEFAULT_EXPECTED_OUTPUT_TOKENS


@runtime_checkable
class OutputTokenEstimate(Protocol):
    """Expected output tokens per item, possibly learned from what was observed."""

    def observe(self, tokens: int) -> None:
        """Record one item's observed output size in tokens."""
        ...

    def expected(self) -> int:
        """Return the output tokens to plan for one item."""
        ...


class FixedOutputTokens:
    """A declared output size per item; observations are ignored.

    Args:
        tokens: Output tokens per item; at least 0.

    Raises:
        ConfigurationError: If ``tokens`` is negative.
    """

    def __init__(self, tokens: int) -> None:
        if tokens < 0:
            raise ConfigurationError(f"declared output tokens must be >= 0, got {tokens!r}")
        self.tokens = int(tokens)

    def observe(self, tokens: int) -> None:
        """Ignore ``tokens``: the declared size wins."""

    def expected(self) -> int:
        """Return the declared size."""
        return self.tokens

    def __repr__(self) -> str:
        return f"FixedOutputTokens({self.tokens})"


class OutputTokenTracker:
    """Learns the output size per item online: a high quantile of recent observations.

    Until ``min_samples`` items were observed, :meth:`expected` returns ``prior``. Planning
    for a high quantile (not the mean) keeps the reply of a whole group from hitting the
    output limit because of a few long answers.

    Args:
        prior: Output tokens per item to assume before enough observations; >= 0.
        quantile: The quantile of recent observations to plan for, in ``(0, 1]``.
        window: How many recent observations to keep (older ones are forgotten, so a
            change in output sizes is tracked).
        min_samples: Observations needed before the prior is dropped; ``1..window``.

    Raises:
        ConfigurationError: If an argument is out of range.
    """

    def __init__(
        self, prior: int, quantile: float = 0.95, window: int = 200, min_samples: int = 10
    ) -> None:
        if prior < 0:
            raise ConfigurationError(f"prior must be >= 0, got {prior!r}")
        if not 0 < quantile <= 1:
            raise ConfigurationError(f"quantile must be in (0, 1], got {quantile!r}")
        if not 1 <= min_samples <= window:
            raise ConfigurationError(
                f"min_samples must be in [1, window={window}], got {min_samples!r}"
            )
        self.prior = int(prior)
        self.quantile = quantile
        self.min_samples = min_samples
        self._recent = WindowQuantile(window)

    @property
    def samples(self) -> int:
        """How many observations are currently in the window."""
        return len(self._recent)

    def observe(self, tokens: int) -> None:
        """Record one item's observed output size; negative values are ignored."""
        if tokens >= 0:
            self._recent.add(float(tokens))

    def expected(self) -> int:
        """Return the ``quantile`` of recent sizes, or ``prior`` before ``min_samples``."""
        if len(self._recent) < self.min_samples:
            return self.prior
        return math.ceil(self._recent.quantile(self.quantile))

    def __repr__(self) -> str:
        return (
            f"OutputTokenTracker(prior={self.prior}, quantile={self.quantile},"
            f" samples={self.samples}, expected={self.expected()})"
        )


class OutputTokenRegistry:
    """One output-size estimate per key (for example ``(function name, partition)``).

    Keys seen for the first time get ``factory()``, by default an
    :class:`OutputTokenTracker` starting from ``default_prior``. :meth:`declare` pins a
    key to a fixed size instead.

    Args:
        default_prior: Prior output tokens per item for new keys.
        factory: Builds the estimate for a new key; overrides ``default_prior``.
    """

    def __init__(
        self,
        default_prior: int = 256,
        factory: Callable[[], OutputTokenEstimate] | None = None,
    ) -> None:
        self._factory = factory or (lambda: OutputTokenTracker(default_prior))
        self._by_key: dict[Hashable, OutputTokenEstimate] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: Hashable) -> OutputTokenEstimate:
        """Return the estimate for ``key``, creating it on first use."""
        found = self._by_key.get(key)
        if found is None:
            found = self._by_key[key] = self._factory()
        return found

    def declare(self, key: Hashable, tokens: int) -> None:
        """Pin ``key`` to a declared output size of ``tokens`` per item."""
        self._by_key[key] = FixedOutputTokens(tokens)

    def observe(self, key: Hashable, tokens: int) -> None:
        """Record one item's observed output size under ``key``."""
        self.get(key).observe(tokens)

    def expected(self, key: Hashable) -> int:
        """Return the output tokens to plan for one item under ``key``."""
        return self.get(key).expected()


#: A packed request asks for this many times its items' expected output (frames
#: included), when that is more than one caller's own cap: room for answers longer
#: than expected, without asking the sum of every caller's cap.
REQUEST_HEADROOM = 2


def request_output_cap(
    members: int,
    *,
    item_cap: int | None,
    configured: int | None,
    expected: int,
    model_limit: int | None = None,
    room: int | None = None,
) -> int | None:
    """The ``max_tokens`` of one request carrying ``members`` items (``None``: the
    provider's default).

    A caller's own cap (``max_tokens`` of a drop-in call) bounds its answer; it is no
    forecast of it, and a framework may send the model's whole output limit. So a
    request of one item asks exactly the caller's cap, as the plain call would; a
    packed one asks what its items are expected to need (:data:`REQUEST_HEADROOM`
    times ``expected``) but at least one caller's cap and at most their sum, within
    the model's output limit and the window's ``room``. ``configured`` (the
    function's ``max_output_tokens``) bounds every request.

    Args:
        members: Items in the request.
        item_cap: The cap each of its callers gave, if any.
        configured: The function's own cap on a reply, if any.
        expected: The output tokens its items are expected to take, frames included.
        model_limit: The most output tokens the model writes in one reply, if known.
        room: Tokens left in the model's context window after the request's input,
            if the window is known.
    """
    if item_cap is None:
        return configured
    if members <= 1:
        return item_cap
    cap = min(item_cap * members, max(item_cap, REQUEST_HEADROOM * expected))
    for bound in (configured, model_limit, room):
        if bound is not None and bound > 0:
            cap = min(cap, bound)
    return cap
