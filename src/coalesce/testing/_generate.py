"""The generation endpoints: ``POST /v1/chat/completions``, ``/v1/responses`` and
``/v1/messages``.

One request goes through :func:`generate` in four steps: admit it (parse, count,
charge the rate limit), refuse it if over the limit, fail it if a fault says so, and
otherwise answer it (reading and writing the prompt cache, whose hits shorten the
time to first token) after the simulated latency, streamed or not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import anyio
from starlette.responses import Response

from ._accounting import RequestRecord
from ._anthropic import ANTHROPIC
from ._call import Call, Simulation
from ._context import output_refusal, refusal, window_for
from ._engine import Answer, Prompt, ReplyContext, compose, prompt_tokens, split_pieces
from ._faults import HTTP_FAULTS, Fault
from ._flavour import Flavour, error_body, error_response, fault_error
from ._http import Unanswered, json_response
from ._latency import Delays, compute_delays
from ._openai import OPENAI, reply_tier
from ._ratelimit import RateDecision, retry_headers
from ._responses import RESPONSES
from ._sending import Ending, hang, streamed, whole
from ._tokens import count_text

__all__ = ["chat_completions", "compose_answer", "generate", "messages", "responses"]

#: Faults that break the connection rather than the answer.
_CONNECTION_FAULTS = frozenset({Fault.HANG, Fault.DISCONNECT})


async def chat_completions(call: Call) -> Response:
    """``POST /v1/chat/completions``."""
    return await generate(call, OPENAI)


async def responses(call: Call) -> Response:
    """``POST /v1/responses``."""
    return await generate(call, RESPONSES)


async def messages(call: Call) -> Response:
    """``POST /v1/messages``."""
    return await generate(call, ANTHROPIC)


def compose_answer(sim: Simulation, prompt: Prompt, faults: frozenset[Fault]) -> Answer:
    """Return the simulated model's answer to ``prompt`` under ``faults``."""
    return compose(
        prompt, faults, lengths=sim.output_tokens, rng=sim.faults.rng, count=count_text,
        degradation=sim.degradation,
    )  # fmt: skip


@dataclass(frozen=True)
class _Turn:
    """One admitted generation request: what it asked and what it will be sent."""

    call: Call
    flavour: Flavour
    prompt: Prompt
    started: float
    tokens_in: int
    clean: Answer  # the answer without faults: what the rate limit charges
    ctx: ReplyContext
    headers: dict[str, str]
    tier: str | None = None  # the service tier (OpenAI), as the reply states it

    def record(
        self, status: int, answer: Answer | None, faults: frozenset[Fault], *, also: str = ""
    ) -> None:
        """Log the request in the provider's ledger (``also``: one more fault name)."""
        sim, prompt = self.call.sim, self.prompt
        sim.ledger.add(
            RequestRecord(
                api=self.flavour.api, model=prompt.model, api_key=self.call.api_key,
                items=self.clean.items, prompt_tokens=self.tokens_in,
                completion_tokens=answer.completion_tokens if answer else 0, status=status,
                faults=tuple(sorted([f.value for f in faults] + ([also] if also else []))),
                started_at=self.started, finished_at=sim.clock.now(), stream=prompt.stream,
                service_tier=self.tier,
                cached_tokens=self.ctx.cached_tokens,
                cache_write_tokens=self.ctx.cache_write_tokens,
                degraded=answer.degraded if answer else 0,
            )
        )  # fmt: skip


async def generate(call: Call, flavour: Flavour) -> Response:
    """Answer one Chat Completions, Responses or Messages request.

    The ``disconnect`` fault raises :class:`SimulatedDisconnect` while the response
    returned is sent, half-way through it.

    Raises:
        HttpError: The request is invalid.
    """
    turn, decision = _admit(call, flavour)
    if decision is None:
        return _too_long(turn)
    if not decision.allowed:
        return _refuse(turn, decision)
    flex = call.sim.flex.refusal(flavour, turn.tier, turn.prompt.model)
    if flex is not None:
        return _flex_refuse(turn, *flex)
    faults = call.sim.faults.next()
    http_faults = sorted(faults & HTTP_FAULTS)
    if http_faults:
        return _fail(turn, http_faults[0])
    return await _answer(turn, faults)


def _admit(call: Call, flavour: Flavour) -> tuple[_Turn, RateDecision | None]:
    """Parse and count the request, and charge it to the caller's rate limit (not if
    it is too long for the model's context window: no decision then)."""
    sim, body = call.sim, call.json_object()
    prompt = flavour.parse(body)
    started = sim.clock.now()
    tokens_in = prompt_tokens(prompt, count_text)
    clean = compose_answer(sim, prompt, frozenset())
    decision = None
    if _refusal(sim, flavour, prompt, tokens_in) is None:
        decision = sim.limiter.check(call.api_key, tokens_in + clean.completion_tokens, started)
    ctx = ReplyContext(
        sim.next_id(flavour.id_prefix), int(sim.clock.unix(started)), tokens_in, prompt, body
    )
    headers = {
        flavour.request_id_header: f"req_{ctx.id}",
        **(flavour.rate_headers(decision, sim.clock.unix(started)) if decision else {}),
    }
    tier = reply_tier(body) if _is_openai(flavour) else None
    return _Turn(call, flavour, prompt, started, tokens_in, clean, ctx, headers, tier), decision


def _is_openai(flavour: Flavour) -> bool:
    """Chat Completions or Responses: service tiers, OpenAI's error codes."""
    return flavour.api.startswith("openai.")


def _refusal(sim: Simulation, flavour: Flavour, prompt: Prompt, tokens_in: int) -> str | None:
    """The provider's message if the request asks more output than the model writes or
    is too long for the model, else ``None``."""
    most = window_for(sim.output_limit, prompt.model)
    if most is not None and prompt.max_tokens is not None and prompt.max_tokens > most:
        return output_refusal(flavour.api, prompt.model, most, prompt.max_tokens)
    window = window_for(sim.context_window, prompt.model)
    if window is None:
        return None
    return refusal(flavour.api, window, tokens_in, prompt.max_tokens)


def _too_long(turn: _Turn) -> Response:
    """Answer ``400``: the request asks more output than the model writes, or its prompt
    and completion limit exceed the context window."""
    message = _refusal(turn.call.sim, turn.flavour, turn.prompt, turn.tokens_in) or ""
    body = error_body(turn.flavour, 400, message)
    if _is_openai(turn.flavour):
        too_long = "context length" in message
        body["error"]["code"] = "context_length_exceeded" if too_long else "invalid_value"
    turn.record(400, None, frozenset())
    return json_response(body, 400, turn.headers)


def _refuse(turn: _Turn, decision: RateDecision) -> Response:
    """Answer ``429``: the caller is over its rate limit."""
    turn.record(429, None, frozenset())
    message = _rate_message(turn.prompt.model, decision)
    headers = {**turn.headers, **retry_headers(decision.retry_after)}
    return error_response(turn.flavour, 429, message, headers)


def _rate_message(model: str, decision: RateDecision) -> str:
    kind = (
        "requests"
        if decision.requests.limit is not None and decision.requests.remaining < 1
        else "tokens"
    )
    quota = decision.requests if kind == "requests" else decision.tokens
    return (
        f"Rate limit reached for {model} on {kind} per min: limit {quota.limit},"
        f" remaining {quota.remaining}. Please try again in {decision.retry_after:.3f}s."
    )


def _flex_refuse(turn: _Turn, status: int, body: dict[str, Any]) -> Response:
    """Answer a flex request its refusal: no capacity (``429``) or no flex for the model."""
    turn.record(status, None, frozenset(), also=str(body["error"].get("code") or ""))
    return json_response(body, status, turn.headers)


def _fail(turn: _Turn, fault: Fault) -> Response:
    """Answer with the error status of an injected fault."""
    status, body = fault_error(turn.flavour, fault)
    turn.record(status, None, frozenset({fault}))
    extra = retry_headers(turn.call.sim.time_scale) if status == 429 else {}
    return json_response(body, status, {**turn.headers, **extra})


async def _answer(turn: _Turn, faults: frozenset[Fault]) -> Response:
    """Answer after the simulated latency, as damaged as the faults say."""
    sim, prompt = turn.call.sim, turn.prompt
    answer = turn.clean
    if faults - _CONNECTION_FAULTS:
        answer = compose_answer(sim, prompt, faults)
    applied = answer.faults | (faults & _CONNECTION_FAULTS)
    turn, delays = _prefill(turn, answer.completion_tokens)
    ending = Ending(lambda status: turn.record(status, answer if status == 200 else None, applied))
    drop = Fault.DISCONNECT in faults
    try:
        if Fault.HANG in faults and await hang(
            sim.fault_plan.hang_seconds * sim.time_scale, turn.call.request
        ):
            ending.gone()
            return Unanswered()
        if prompt.stream:
            events = turn.flavour.stream(answer, split_pieces(answer.text), turn.ctx)
            return streamed(turn.flavour, events, delays, turn.headers, ending, drop=drop)
        await anyio.sleep(delays.total)
    except BaseException:  # cancelled: the client went away before the answer was complete
        ending.gone()
        raise
    return whole(turn.flavour.render(answer, turn.ctx), turn.headers, ending, drop=drop)


def _prefill(turn: _Turn, tokens_out: int) -> tuple[_Turn, Delays]:
    """Read the prompt cache, time the answer, and cache what the request writes (usable
    once its first token is out)."""
    sim, prompt, started = turn.call.sim, turn.prompt, turn.started
    scope = (turn.call.api_key, prompt.model)
    use = sim.prompt_cache.lookup(prompt.cache, scope, turn.tokens_in, started, count_text)
    slowdown = sim.flex.slowdown(turn.tier)
    delays = _delays(sim, prompt.model, turn.tokens_in, tokens_out, use.read, slowdown)
    sim.prompt_cache.commit(use, started, started + delays.first_token)
    ctx = replace(turn.ctx, cached_tokens=use.read, cache_write_tokens=use.written)
    return replace(turn, ctx=ctx), delays


def _delays(
    sim: Simulation, model: str, tokens_in: int, tokens_out: int, cached: int, slowdown: float
) -> Delays:
    return compute_delays(
        sim.latency.profile_for(model), tokens_in, tokens_out, time_scale=sim.time_scale * slowdown,
        jitter=sim.latency.jitter, noise=sim.jitter_rng.random(), cached_tokens=cached,
    )  # fmt: skip
