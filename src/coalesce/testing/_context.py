"""Context windows: the simulated model refuses a request too long for it, as real APIs do.

Pure: :func:`window_for` reads the configured window of a model and :func:`refusal`
writes the provider's own message (OpenAI's ``context_length_exceeded``, Anthropic's
"prompt is too long"), so a client can learn the window from the error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

from coalesce.exceptions import ConfigurationError

__all__ = ["ContextWindows", "check_windows", "output_refusal", "refusal", "window_for"]

#: One window (tokens) for every model, one per model name, or ``None``: no limit.
ContextWindows: TypeAlias = "int | Mapping[str, int] | None"


def check_windows(windows: ContextWindows, name: str = "context_window") -> ContextWindows:
    """Return ``windows`` (one limit for every model, one per model name, or ``None``) if
    every window is a positive number of tokens; ``name`` is the option's.

    Raises:
        ConfigurationError: A window is not a positive integer.
    """
    values = windows.values() if isinstance(windows, Mapping) else [windows]
    for value in values:
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConfigurationError(
                f"{name} must be a positive number of tokens, or a mapping of model"
                f" names to one, got {windows!r}"
            )
    return windows


def window_for(windows: ContextWindows, model: str) -> int | None:
    """Return the context window of ``model``, or ``None`` for no limit."""
    if isinstance(windows, Mapping):
        return windows.get(model)
    return windows


def refusal(api: str, window: int, tokens_in: int, max_tokens: int | None) -> str | None:
    """Return the provider's message (``api``: ``"openai.chat"``, ``"openai.responses"``
    or ``"anthropic.messages"``) refusing a request of ``tokens_in`` prompt tokens and
    ``max_tokens`` too long for ``window``, or ``None``."""
    wanted = tokens_in + (max_tokens or 0)
    if wanted <= window:
        return None
    if api.startswith("anthropic"):
        if tokens_in > window:
            return f"prompt is too long: {tokens_in} tokens > {window} maximum"
        return (
            f"input length and `max_tokens` exceed context limit: {tokens_in} + {max_tokens}"
            f" > {window}, decrease input length or `max_tokens` and try again"
        )
    return (
        f"This model's maximum context length is {window} tokens. However, you requested"
        f" {wanted} tokens ({tokens_in} in the messages, {max_tokens or 0} in the completion)."
        " Please reduce the length of the messages or completion."
    )


def output_refusal(api: str, model: str, limit: int, max_tokens: int) -> str:
    """Return the provider's message (``api`` as :func:`refusal`'s) refusing a
    ``max_tokens`` above the model's output ``limit`` (OpenAI's and Anthropic's wording)."""
    if api.startswith("anthropic"):
        return (
            f"max_tokens: {max_tokens} > {limit}, which is the maximum allowed number of"
            f" output tokens for {model}"
        )
    return (
        f"max_tokens is too large: {max_tokens}. This model supports at most {limit}"
        f" completion tokens, whereas you provided {max_tokens}."
    )
