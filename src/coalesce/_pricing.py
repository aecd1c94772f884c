"""Model prices, for the estimated cost in the statistics.

Prices are in US dollars per million tokens. :data:`DEFAULT_PRICES` holds the list
prices of a few common models as they were when this table was written; providers
change them, so a user who cares about the figure passes their own table, which
takes precedence over the defaults entry by entry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ._exceptions import ConfigurationError

__all__ = ["DEFAULT_PRICES", "LANE_PRICE", "Price", "PromptCache", "cost", "price_for", "price_of"]

_PER = 1_000_000


@dataclass(frozen=True)
class Price:
    """What a model costs, in US dollars per million tokens.

    Attributes:
        input_per_mtok: Price of a million prompt tokens.
        output_per_mtok: Price of a million reply tokens.
        cached_input_per_mtok: Price of a million prompt tokens served from the
            provider's prompt cache, or ``None`` if the model has no cache discount.
        cache_write_per_mtok: Price of a million prompt tokens written to the cache
            (Anthropic: 1.25x the input price), or ``None``: the input price.

    Raises:
        ConfigurationError: If a price is negative or not a finite number.
    """

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None

    def __post_init__(self) -> None:
        for name in (
            "input_per_mtok",
            "output_per_mtok",
            "cached_input_per_mtok",
            "cache_write_per_mtok",
        ):
            value = getattr(self, name)
            if value is None and name.startswith("cache"):
                continue
            if not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ConfigurationError(
                    f"Price.{name} must be a finite number of dollars >= 0, got {value!r}"
                )

    def scaled(self, factor: float) -> Price:
        """Every rate times ``factor`` (a lane's discount, see :data:`LANE_PRICE`)."""
        if factor == 1.0:
            return self

        def times(rate: float | None) -> float | None:
            return None if rate is None else rate * factor

        return Price(
            self.input_per_mtok * factor,
            self.output_per_mtok * factor,
            times(self.cached_input_per_mtok),
            times(self.cache_write_per_mtok),
        )


#: What each lane costs as a fraction of the list price: OpenAI's flex processing is
#: billed at batch prices, and both providers' batch APIs at half the list price.
LANE_PRICE: Mapping[str, float] = MappingProxyType({"realtime": 1.0, "flex": 0.5, "batch": 0.5})


@dataclass(frozen=True)
class PromptCache:
    """How a provider caches prompt prefixes, for the cost of plain and packed calls.

    Attributes:
        min_tokens: The shortest prefix the provider caches (OpenAI 1,024; Anthropic
            1,024 to 4,096 by model).
        read_price: A cached token's price as a fraction of an input token's (OpenAI
            0.1 to 0.5 by model, Anthropic 0.1). ``None``: from the model's
            :class:`~coalesce.Price` (``cached_input_per_mtok / input_per_mtok``).
    """

    min_tokens: int = 1024
    read_price: float | None = None

    def discount(self, price: Price | None) -> float:
        """What a warm cached token costs, as a fraction of an input token."""
        if self.read_price is not None:
            return self.read_price
        if price is None or price.cached_input_per_mtok is None or price.input_per_mtok <= 0:
            return 1.0
        return price.cached_input_per_mtok / price.input_per_mtok


#: List prices as of 2025 (USD per million tokens). Override them: they change.
DEFAULT_PRICES: Mapping[str, Price] = MappingProxyType(
    {
        "gpt-4o": Price(2.50, 10.00, 1.25),
        "gpt-4o-mini": Price(0.15, 0.60, 0.075),
        "gpt-4.1": Price(2.00, 8.00, 0.50),
        "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
        "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
        "gpt-5": Price(1.25, 10.00, 0.125),
        "gpt-5-mini": Price(0.25, 2.00, 0.025),
        "gpt-5-nano": Price(0.05, 0.40, 0.005),
        "claude-sonnet-4": Price(3.00, 15.00, 0.30, 3.75),
        "claude-haiku-4-5": Price(1.00, 5.00, 0.10, 1.25),
        "claude-3-5-haiku": Price(0.80, 4.00, 0.08, 1.00),
    }
)

# What may follow a table key for a longer model name to share its price: a dated or
# numbered variant ("gpt-4o-2024-08-06", "claude-sonnet-4-20250514") or an alias
# ("-latest"). A word ("-mini", "-nano", "-audio") names a different model.
_VARIANT = re.compile(r"-(?:\d|latest\b)")


def price_for(model: str, table: Mapping[str, Price] | None = None) -> Price | None:
    """The price of ``model``, or ``None`` if no table entry names it.

    An exact entry wins; otherwise the longest entry that ``model`` extends with a
    dated or numbered variant (``gpt-4o-2024-08-06`` is priced as ``gpt-4o``, but
    ``gpt-4o-audio-preview`` is not). A routing prefix such as ``openai/`` is
    ignored. Entries of ``table`` take precedence over :data:`DEFAULT_PRICES`.

    Args:
        model: The model name sent to the provider.
        table: Prices to use in addition to, and before, the defaults.
    """
    prices = {**DEFAULT_PRICES, **(table or {})}
    name = model.rsplit("/", 1)[-1]
    for candidate in (model, name):
        if candidate in prices:
            return prices[candidate]
    matches = [key for key in prices if name.startswith(key) and _VARIANT.match(name, len(key))]
    return prices[max(matches, key=len)] if matches else None


def cost(
    input_tokens: int,
    output_tokens: int,
    price: Price,
    *,
    cached_input_tokens: int = 0,
    cache_write_tokens: int = 0,
) -> float:
    """Dollars for one request's tokens.

    Args:
        input_tokens: Prompt tokens, cached ones included (as providers report them).
        output_tokens: Reply tokens.
        price: The model's price.
        cached_input_tokens: How many of ``input_tokens`` came from the prompt cache;
            billed at ``price.cached_input_per_mtok`` when the model has one.
        cache_write_tokens: How many of ``input_tokens`` were written to the prompt
            cache; billed at ``price.cache_write_per_mtok`` when the model has one.
    """
    cached_rate, write_rate = price.cached_input_per_mtok, price.cache_write_per_mtok
    cached = 0 if cached_rate is None else max(0, min(cached_input_tokens, input_tokens))
    written = 0 if write_rate is None else max(0, min(cache_write_tokens, input_tokens - cached))
    return (
        (input_tokens - cached - written) * price.input_per_mtok
        + cached * (cached_rate or 0.0)
        + written * (write_rate or 0.0)
        + output_tokens * price.output_per_mtok
    ) / _PER


def price_of(model: str, prices: Price | Mapping[str, Price] | None) -> Price | None:
    """The price of ``model`` under a ``prices=`` option: the :class:`Price` given, else
    the model's entry in the table given (then :data:`DEFAULT_PRICES`, see
    :func:`price_for`); ``None`` when no entry names it."""
    return prices if isinstance(prices, Price) else price_for(model, prices)
