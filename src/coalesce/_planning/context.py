"""How many tokens one request may hold: the model's context window and output limit.

Three sources, the later winning: a table of known model families (:func:`known_window`),
the function's ``context_window=`` option, and what the provider itself said when it
refused a request as too long (:func:`context_error_window`, learned by a
:class:`ContextWindow` listening to the group runner). A model that is not in the table
is not checked until its window is set or learned.

A model's *output limit* (the largest ``max_tokens`` it accepts) comes the same way, from
a table (:func:`known_output_limit`) or the provider's refusal
(:func:`output_limit_error`): a packed request never asks for more than it.

The figures are the providers' public ones as of late 2026, for each family's default
endpoint; a deployment may be smaller (a llama.cpp server started with ``-c 4096``), in
which case its first context-length error teaches the real figure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from .reports import Planned, Report
from .tokens import TokenEstimator, count_json_tokens

__all__ = [
    "KNOWN_OUTPUT_LIMITS",
    "KNOWN_WINDOWS",
    "ContextWindow",
    "context_error_window",
    "is_context_error",
    "is_limit_error",
    "known_output_limit",
    "known_window",
    "output_limit_error",
]

_START = r"(?<![a-z0-9])"  # a family name starts the model name or one of its parts

#: Known context windows (input plus output tokens), by family: the first pattern that
#: matches the lower-cased model name anywhere after a separator wins, so the more
#: specific ones come first. Public figures, late 2026; unknown models are not checked
#: until their window is set (``context_window=``) or learned from the provider.
KNOWN_WINDOWS: tuple[tuple[str, int], ...] = (
    # OpenAI
    (r"gpt-4\.1", 1_047_576),
    (r"gpt-5(?:\.\d+)?-chat", 128_000),
    (r"gpt-5", 400_000),
    (r"(?:chatgpt-)?gpt-4o", 128_000),
    (r"gpt-4-turbo|gpt-4-\d{4}-preview", 128_000),
    (r"gpt-4-32k", 32_768),
    (r"gpt-4(?:-0314|-0613)?$", 8_192),
    (r"gpt-3\.5-turbo", 16_385),
    (r"o1-(?:mini|preview)", 128_000),
    (r"o[134](?:-|$)", 200_000),
    # Anthropic
    (r"claude-(?:2|instant)", 100_000),
    (r"claude", 200_000),
    # Open-weight families, at their released (not extended) context
    (r"(?:meta-)?llama-?3\.[123]", 128_000),
    (r"(?:meta-)?llama-?3(?![.\d])", 8_192),
    (r"qwen2\.5", 32_768),
    (r"smollm2", 8_192),
    (r"codestral", 256_000),
    (r"mixtral-8x22b", 65_536),
    (r"(?:open-)?mistral-(?:large|medium|nemo)|ministral", 128_000),
    (r"(?:open-)?mi[sx]tral", 32_768),
)

_TABLE = tuple((re.compile(_START + pattern), tokens) for pattern, tokens in KNOWN_WINDOWS)

#: Known output limits (the largest ``max_tokens`` one reply may ask for), by family, as
#: :data:`KNOWN_WINDOWS`. Public figures, late 2026; a family not listed is not capped
#: until its provider refuses a request's ``max_tokens`` and says the limit.
KNOWN_OUTPUT_LIMITS: tuple[tuple[str, int], ...] = (
    # OpenAI
    (r"gpt-4\.1", 32_768),
    (r"gpt-5(?:\.\d+)?-chat", 16_384),
    (r"gpt-5", 128_000),
    (r"(?:chatgpt-)?gpt-4o", 16_384),
    (r"gpt-4-turbo|gpt-4-\d{4}-preview", 4_096),
    (r"gpt-3\.5-turbo", 4_096),
    (r"o1-(?:mini|preview)", 32_768),
    (r"o[134](?:-|$)", 100_000),
    # Anthropic
    (r"claude-(?:opus|sonnet)-4-[6-9]|claude-(?:opus|sonnet|haiku)-5", 128_000),
    (r"claude-(?:haiku|sonnet|opus)-4-5|claude-sonnet-4|claude-3-7-sonnet", 64_000),
    (r"claude-opus-4", 32_000),
    (r"claude-3-5", 8_192),
    (r"claude-3", 4_096),
)

_OUTPUT_TABLE = tuple(
    (re.compile(_START + pattern), tokens) for pattern, tokens in KNOWN_OUTPUT_LIMITS
)


def known_output_limit(model: str) -> int | None:
    """The table's output limit for ``model`` (``None``: not a known family).

    Args:
        model: The model name as sent to the provider.
    """
    return _look_up(_OUTPUT_TABLE, model)


def _look_up(table: tuple[tuple[re.Pattern[str], int], ...], model: str) -> int | None:
    """The figure of the first family in ``table`` that ``model`` belongs to."""
    name = model.lower()
    for pattern, tokens in table:
        if pattern.search(name):
            return tokens
    return None


def known_window(model: str) -> int | None:
    """The table's context window for ``model`` (``None``: not a known family).

    Args:
        model: The model name as sent to the provider (``"gpt-4o-mini"``,
            ``"meta-llama/Llama-3.1-8B-Instruct"``, ``"qwen2.5:7b"``...).
    """
    return _look_up(_TABLE, model)


# -- what providers say when a request is too long ------------------------------------

_NUMBER = r"(\d[\d,_]*)"

#: Messages that state the window, one capture group for it. OpenAI (and vLLM, Groq,
#: DeepSeek and most OpenAI-compatible servers): "This model's maximum context length
#: is 128000 tokens. However, ..."; vLLM: "... longer than the maximum model length of
#: 4096"; Anthropic: "prompt is too long: 210000 tokens > 200000 maximum" and "input
#: length and `max_tokens` exceed context limit: 198000 + 4096 > 200000"; llama.cpp's
#: server: "request (6031 tokens) exceeds the available context size (1024 tokens), try
#: increasing it" with ``"n_ctx": 1024`` in the body; Mistral: "... too large for model
#: with 32768 maximum context length"; Hugging Face TGI: "... must be <= 4096. Given:";
#: Gemini: "... exceeds the maximum number of tokens allowed (1048576)".
_STATED = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        rf"maximum context length is {_NUMBER}",
        rf"maximum model length (?:of|is) {_NUMBER}",
        rf"prompt is too long: \d+ tokens > {_NUMBER} maximum",
        rf"exceed context limit: \d+ \+ \d+ > {_NUMBER}",
        rf"context size \({_NUMBER} tokens\)",
        rf"['\"]n_ctx['\"]\s*:\s*{_NUMBER}",
        rf"too large for model with {_NUMBER} maximum context length",
        rf"must be <= {_NUMBER}\. Given:",
        rf"maximum number of tokens allowed \({_NUMBER}\)",
    )
)

#: Messages (or error codes) of a context-length error that may not state the window:
#: OpenAI's ``context_length_exceeded`` code, llama.cpp's older "the request exceeds the
#: available context size, try increasing it" and its mid-reply "Context size has been
#: exceeded.", Ollama's "input length exceeds the context length".
_UNSTATED = re.compile(
    r"context_length_exceeded|exceed_context_size_error|exceeds the available context size"
    r"|context size has been exceeded|exceeds the context (?:window|length)"
    r"|input length exceeds the context length|prompt is too long|maximum context length",
    re.IGNORECASE,
)


def _messages(error: BaseException) -> list[str]:
    """The texts of ``error`` and of the errors it was raised from (a few levels), with
    the SDKs' parsed error bodies (where a server's error type and code are)."""
    texts: list[str] = []
    current: BaseException | None = error
    for _ in range(4):
        if current is None:
            break
        texts.append(str(current))
        body = getattr(current, "body", None)
        if body is not None:
            texts.append(str(body))
        current = current.__cause__ or current.__context__
    return texts


#: Messages refusing a request's ``max_tokens`` as more than the model writes, the limit
#: captured. OpenAI: "max_tokens is too large: 1280000. This model supports at most
#: 16384 completion tokens, whereas you provided 1280000."; Anthropic: "max_tokens:
#: 1280000 > 64000, which is the maximum allowed number of output tokens for ...";
#: vLLM-style servers: "max_tokens must be at most 4096".
_OUTPUT_STATED = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        rf"supports at most {_NUMBER} completion tokens",
        rf"max_tokens: \d+ > {_NUMBER}, which is the maximum allowed number of output",
        rf"max_(?:completion_|output_)?tokens must be (?:at most|<=) {_NUMBER}",
    )
)


def output_limit_error(error: BaseException) -> int | None:
    """The output limit a provider's error states, if it refused a request's
    ``max_tokens`` as more than the model may write; else ``None``.

    Args:
        error: What the provider raised.
    """
    return _stated(error, _OUTPUT_STATED)


def _stated(error: BaseException, patterns: tuple[re.Pattern[str], ...]) -> int | None:
    """The number the first of ``patterns`` that matches ``error``'s texts captures."""
    for text in _messages(error):
        for pattern in patterns:
            found = pattern.search(text)
            if found is not None:
                return int(re.sub(r"[,_]", "", found.group(1)))
    return None


def context_error_window(error: BaseException) -> int | None:
    """The context window a provider's error states, if it is a context-length error.

    ``None`` when the error is not one, or does not say the window (see
    :func:`is_context_error` for those).

    Args:
        error: What the provider raised (its SDK's exception, or ours with it as cause).
    """
    return _stated(error, _STATED)


def is_context_error(error: BaseException) -> bool:
    """Whether ``error`` says the request did not fit the model's context window.

    Args:
        error: What the provider raised.
    """
    if context_error_window(error) is not None:
        return True
    return any(_UNSTATED.search(text) for text in _messages(error))


def is_limit_error(error: BaseException) -> bool:
    """Whether ``error`` refused the request's size: its context length, or its
    ``max_tokens`` beyond the model's output limit (a smaller request may pass)."""
    return output_limit_error(error) is not None or is_context_error(error)


class ContextWindow:
    """One model's context window: from the table, the option, or the provider's word.

    A :class:`~coalesce._calls.GroupObserver`: a request the provider refused as too
    long teaches the window it states or, when it states none (and an ``estimator`` is
    given), that the window is smaller than what was sent.

    Args:
        model: The model name (looked up in :data:`KNOWN_WINDOWS`).
        configured: The ``context_window=`` option, which replaces the table's figure.
        estimator: Counts a refused request's items, when the error states no window.
        shared_tokens: Tokens every request pays besides its items (instructions).
    """

    def __init__(
        self,
        model: str,
        configured: int | None = None,
        *,
        estimator: TokenEstimator | None = None,
        shared_tokens: int = 0,
    ) -> None:
        self.model = model
        self.configured = configured
        self.known = known_window(model)
        self.learned: int | None = None
        #: The most output tokens one reply may ask for (``None``: unknown), from the
        #: table, then from the provider's refusal.
        self.output_limit = known_output_limit(model)
        self._estimator = estimator
        self._shared = shared_tokens

    @property
    def limit(self) -> int | None:
        """Tokens one request may hold, input and output together (``None``: unknown)."""
        if self.learned is not None:
            return self.learned
        return self.configured if self.configured is not None else self.known

    @property
    def source(self) -> str:
        """Where :attr:`limit` comes from, for messages."""
        if self.learned is not None:
            return "as the provider's context-length error said"
        if self.configured is not None:
            return "set by context_window="
        return f"known for {self.model!r}"

    def learn(self, error: BaseException, *, sent_tokens: int | None = None) -> bool:
        """Learn from ``error`` if it is a context-length error, or a refusal of the
        request's ``max_tokens`` that states the model's output limit; whether it was.

        Args:
            error: What the provider raised.
            sent_tokens: Estimated tokens of the refused request, used when the error
                does not state the window (the window is then taken as one less).
        """
        output = output_limit_error(error)
        if output is not None:
            self.output_limit = output
            return True
        stated = context_error_window(error)
        if stated is None and sent_tokens is not None and is_context_error(error):
            current = self.limit
            stated = sent_tokens - 1 if current is None else min(current, sent_tokens - 1)
        if stated is None or stated < 1:
            return False
        self.learned = stated
        return True

    # -- a GroupObserver ---------------------------------------------------------------

    def request_sent(self, slots: Mapping[str, Sequence[Planned]], reask: bool) -> None:
        """Nothing to learn before the reply."""

    def request_done(self, report: Report) -> None:
        """Learn from a request the provider refused as too long."""
        error = report.error
        if error is not None and is_limit_error(error):
            self.learn(error, sent_tokens=self._sent_tokens(report))

    def _sent_tokens(self, report: Report) -> int | None:
        """Estimated tokens of the request of ``report``: instructions, items, outputs."""
        if self._estimator is None or not report.slots:
            return None
        total = self._shared
        for jobs in report.slots.values():
            plan = jobs[0].plan
            total += count_json_tokens(jobs[0].item, self._estimator)
            total += 0 if plan is None else plan.output_tokens
        return total

    def retrying(self, retry: object) -> None:
        """Nothing to learn from a retry (a context error is not retried)."""

    def group_done(self, jobs: Sequence[Planned]) -> None:
        """Nothing to learn when a group is done."""

    def __repr__(self) -> str:
        return f"ContextWindow({self.model!r}, limit={self.limit}, {self.source})"
