"""The simulated provider: its public face, and the ways to reach it (ASGI, a local
server, the SDKs' clients); its configuration and state are
:class:`~coalesce.testing._provider_state.ProviderState`."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from os import PathLike
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from ._accounting import RequestRecord, SimulatorStatistics
from ._app import create_app
from ._batches import BatchSubmission
from ._config import load_config, provider_options
from ._degradation import degraded_output
from ._faults import FaultSpec
from ._length import target_tokens
from ._model import expected_output
from ._provider_state import ProviderState
from ._server import ServerThread

if TYPE_CHECKING:
    import anthropic
    import httpx2
    import openai

__all__ = ["SimulatedProvider"]

_IN_PROCESS_URL = "http://simulated-provider.test"

_Client = TypeVar("_Client")


class SimulatedProvider(ProviderState):
    """A simulated OpenAI and Anthropic API with latency, rate limits and faults.

    The provider is an ASGI app: give it to ``httpx2.ASGITransport`` to test in
    process, or serve it on 127.0.0.1 with :meth:`serve`.

    Args:
        latency: Latency profiles per model (default: one profile for every model).
        rate_limits: Limits per API key, or one :class:`RateLimit` for every key.
        faults: Faults to inject, by probability or script.
        output_tokens: Target answer length per item: a number, a callable of the
            item (e.g. :class:`LongTail`), or ``None`` for the natural length.
        batches: How long batches take to validate, run and finalize, and their
            completion window (24 hours): lines not done by then expire.
        time_scale: Multiplies every duration: latencies, rate-limit windows, batch
            times, hangs. ``0.001`` runs a thousand times faster than real.
        seed: Seed of the latency jitter.
        context_window: The models' context windows in tokens: one for every model, or
            one per model name (others have none). A request whose prompt and
            completion limit exceed it is refused with ``400`` and the provider's own
            message ("maximum context length is ...", "prompt is too long: ...").
            ``None`` (the default): no limit.
        output_limit: The most output tokens a request may ask for (``max_tokens``),
            as real models have: one for every model, or one per model name (others
            have none). A request asking more is refused with ``400`` and the
            provider's own message ("This model supports at most 16384 completion
            tokens", "max_tokens: ... > 64000, which is the maximum allowed number of
            output tokens"). ``None`` (the default): no limit.
        prompt_cache: Prompt caching as the providers document it: ``True`` (the
            default) with the providers' settings, a :class:`SimulatedPromptCache` to
            change them, or ``False`` for none. OpenAI caches every prompt of 1,024
            tokens or more and reports ``prompt_tokens_details.cached_tokens``;
            Anthropic caches prefixes marked with ``cache_control`` and reports
            ``cache_creation_input_tokens`` and ``cache_read_input_tokens``. Cached
            tokens add nothing to the time to first token, and every
            :class:`RequestRecord` counts them.
        flex: How OpenAI flex requests (``service_tier="flex"``) are served: slower
            by :attr:`FlexProcessing.latency_factor` (3), and refused with ``429``
            ``resource_unavailable`` with the chance
            :attr:`FlexProcessing.unavailable` (0.05, seeded). ``None``: the defaults.
        enqueued_token_limit: Prompt tokens a model may have in unfinished batches
            (each API counts its own): one limit for every model, or one per model
            name (others have none). A create over it fails: OpenAI's batch ends
            ``failed`` with the error ``token_limit_exceeded``, Anthropic's create is
            refused with ``429``. ``None`` (the default): no limit.
        degradation: How packing worsens answers: each item of a packed request is
            answered wrongly (:meth:`degraded_output`) with a chance that grows with
            the group's size and the item's position (see :class:`PackingDegradation`).
            A plain request is never degraded. ``None`` (the default): never.

    Raises:
        ConfigurationError: An option is out of range.
    """

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SimulatedProvider:
        """Build a provider from a configuration mapping (see the testing guide).

        Args:
            config: The parsed JSON or TOML configuration.

        Raises:
            ConfigurationError: A key or value is invalid.
        """
        return cls(**provider_options(config))

    @classmethod
    def from_file(cls, path: str | PathLike[str]) -> SimulatedProvider:
        """Build a provider from a JSON (or, on Python 3.11+, TOML) file.

        Args:
            path: The configuration file.

        Raises:
            ConfigurationError: The file cannot be parsed or holds invalid options.
        """
        return cls.from_config(load_config(path))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point."""
        await self._app(scope, receive, send)

    def prepare(self) -> None:
        """Build the app and load the token counter now (serving calls this first), so
        that the first request's latency is the simulated model's, not the set-up's."""
        self._app  # noqa: B018

    @functools.cached_property
    def _app(self) -> Starlette:
        """The Starlette app that serves this provider (:mod:`~coalesce.testing._app`)."""
        return create_app(self)

    @property
    def requests(self) -> tuple[RequestRecord, ...]:
        """Every request so far, in order of completion."""
        return self.ledger.records()

    def statistics(self) -> SimulatorStatistics:
        """Return the totals over every request since the start or the last reset."""
        return self.ledger.statistics()

    def inject(self, *requests: FaultSpec) -> None:
        """Script the faults of the next requests, one argument per request.

        ``sim.inject("rate_limit", None, ["missing_item", "out_of_order"])`` makes
        the next request a 429, leaves the one after alone, and damages the third.

        Args:
            requests: For each coming request, ``None`` or one or more faults.

        Raises:
            ConfigurationError: A name is not a fault.
        """
        self.faults.inject(*requests)

    def inject_flex(self, *refusals: bool) -> None:
        """Script the next flex requests, one argument per request: ``True`` refuses
        it with ``429`` ``resource_unavailable``, ``False`` serves it (no draw).

        Args:
            refusals: For each coming flex request, whether it is refused.

        Raises:
            ConfigurationError: An entry is not a bool.
        """
        self.flex.inject(*refusals)

    def expire_next_batch(self, after_lines: int = 0) -> None:
        """Make the next batch created (either API, failed ones aside) stop after its
        first ``after_lines`` lines and expire at the end of its completion window
        (``BatchTiming.completion_window`` times ``time_scale`` after its creation).

        Calls queue up: each one applies to one batch, in order.

        Args:
            after_lines: Lines done before the batch stalls (0: none).

        Raises:
            ConfigurationError: ``after_lines`` is not an integer >= 0.
        """
        self.batches.stall_next(after_lines)

    @property
    def batch_submissions(self) -> tuple[BatchSubmission, ...]:
        """Every batch created since the start or the last reset, in order: what a
        test counts submissions (and repeated custom ids) with."""
        return self.batches.submissions()

    def expected_output(self, item_input: Any, schema: Mapping[str, Any] | None = None) -> Any:
        """Return the answer this provider gives to ``item_input``.

        Same as :func:`coalesce.testing.expected_output` with this provider's
        ``output_tokens``.

        Args:
            item_input: The item.
            schema: The JSON schema of one item's output, if any.
        """
        return self._answer(expected_output, item_input, schema)

    def degraded_output(self, item_input: Any, schema: Mapping[str, Any] | None = None) -> Any:
        """Return the wrong answer this provider gives to ``item_input`` when its
        :class:`PackingDegradation` hits it.

        Same as :func:`coalesce.testing.degraded_output` with this provider's
        ``output_tokens``.

        Args:
            item_input: The item, as for :meth:`expected_output`.
            schema: The JSON schema, as for :meth:`expected_output`.
        """
        return self._answer(degraded_output, item_input, schema)

    def _answer(
        self, answer: Callable[..., Any], item_input: Any, schema: Mapping[str, Any] | None
    ) -> Any:
        """``answer``'s output for ``item_input`` at this provider's ``output_tokens``."""
        return answer(
            item_input, schema, output_tokens=target_tokens(self.output_tokens, item_input)
        )

    @contextmanager
    def serve(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
        """Serve over real HTTP in a background thread; yield the base URL.

        The OpenAI SDK wants ``f"{base_url}/v1"``; the Anthropic SDK ``base_url``.

        Args:
            host: The interface to bind.
            port: The port; 0 picks a free one.
        """
        self.prepare()
        with ServerThread(self, host, port) as base_url:
            yield base_url

    @asynccontextmanager
    async def serve_async(self, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
        """Like :meth:`serve`, without blocking the event loop while starting and stopping.

        Args:
            host: The interface to bind.
            port: The port; 0 picks a free one.
        """
        self.prepare()
        async with ServerThread(self, host, port) as base_url:
            yield base_url

    def openai_client(self, base_url: str | None = None, **options: Any) -> openai.AsyncOpenAI:
        """Return an ``openai.AsyncOpenAI`` wired to this provider.

        Args:
            base_url: The server's root URL from :meth:`serve` (the client gets
                ``f"{base_url}/v1"``); ``None`` to talk to the provider in process.
            options: More arguments for ``AsyncOpenAI`` (``max_retries``, ...);
                ``api_key`` defaults to ``"sk-simulated"``.
        """
        import openai

        return self._sdk_client(openai.AsyncOpenAI, base_url, "/v1", "sk-simulated", options)

    def anthropic_client(
        self, base_url: str | None = None, **options: Any
    ) -> anthropic.AsyncAnthropic:
        """Return an ``anthropic.AsyncAnthropic`` wired to this provider.

        Args:
            base_url: The server's root URL from :meth:`serve`, as it is (the
                Anthropic SDK adds ``/v1`` itself); ``None`` for in process.
            options: More arguments for ``AsyncAnthropic`` (``max_retries``, ...);
                ``api_key`` defaults to ``"sk-ant-simulated"``.
        """
        import anthropic

        return self._sdk_client(anthropic.AsyncAnthropic, base_url, "", "sk-ant-simulated", options)

    def _sdk_client(
        self,
        sdk: Callable[..., _Client],
        base_url: str | None,
        api_path: str,
        api_key: str,
        options: dict[str, Any],
    ) -> _Client:
        """Build an SDK client for ``base_url``, or in process when it is ``None``."""
        options.setdefault("api_key", api_key)
        if base_url is None:
            from ._inprocess import in_process_client  # imports httpx2: only when needed

            http = in_process_client(self, _IN_PROCESS_URL)
            return sdk(base_url=f"{_IN_PROCESS_URL}{api_path}", http_client=http, **options)
        return sdk(base_url=f"{base_url}{api_path}", **options)

    def transport(self) -> httpx2.AsyncBaseTransport:
        """Return an ``httpx2`` transport that calls this provider in process.

        It is ``httpx2.ASGITransport(app=self)``, except that the ``disconnect``
        fault raises ``httpx2.RemoteProtocolError`` as a real dropped connection
        does (the plain ``ASGITransport`` raises :class:`SimulatedDisconnect`).
        """
        from ._inprocess import SimulatedTransport  # imports httpx2: only when needed

        return SimulatedTransport(app=self)

    def __repr__(self) -> str:
        stats = self.statistics()
        return (
            f"<SimulatedProvider time_scale={self.time_scale} requests={stats.requests}"
            f" faults_scripted={self.faults.pending}>"
        )
