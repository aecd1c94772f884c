"""litellm and DSPy, which own their HTTP clients, pointed at the gateway by
``api_base``: 40 concurrent calls reach the simulator in at most 10 requests, and every
caller gets its own answer.

litellm and DSPy are imported by the ``offline`` fixture, after it has set their
environment (``_litellm.py``): both run on asyncio only, on the real clock, as the
gateway's other tests do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from _litellm import expected_triage, offline, triage_signature
from _serving import Running, gateway_config, serving
from _traffic import (
    ANTHROPIC_MODEL,
    CALLS,
    INSTRUCTIONS,
    MOST_REQUESTS,
    OPENAI_MODEL,
    Ticket,
    expected_text,
    expected_ticket,
    gather,
    tickets,
)

from coalesce.testing import RequestRecord, SimulatedProvider

T = TypeVar("T")

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.integration,
    pytest.mark.parametrize("real_time_backend", ["asyncio"], indirect=True),
]

#: An Anthropic model in litellm's cost map: litellm asks it for structured output
#: natively (``output_format``), not through a forced tool.
KNOWN_ANTHROPIC_MODEL = "claude-haiku-4-5"


@pytest.fixture
async def gateway(sim_url: str) -> AsyncIterator[Running]:
    """The gateway at a 5 s budget: these calls run in real time on a shared CI machine,
    where a cold function's probe can take most of 2 s; the tests check structure and
    delivery (at most 10 requests for 40 calls, each its own answer), not latency (the
    2 s figures are benchmarks/bench_frameworks.py's)."""
    async with serving(gateway_config(sim_url, budget=5.0)) as running:
        yield running


@pytest.fixture(autouse=True)
async def no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AsyncIterator[None]:
    guard = offline(monkeypatch, tmp_path)
    yield
    import litellm

    await litellm.close_litellm_async_clients()
    litellm.in_memory_llm_clients_cache.flush_cache()
    assert guard.refused == [], f"a test reached for the network: {guard.refused}"


async def through_gateway(
    sim: SimulatedProvider, call: Callable[[str], Awaitable[T]], asked: list[str]
) -> tuple[list[T], list[RequestRecord]]:
    """``call`` for every ticket at once; their answers, and the requests they made.

    One call of the same shape first (its ticket not asked), so that what the framework
    does once per process (imports, loading its tables) does not spread the 40 over
    time; its request is not counted.
    """
    await call(tickets(1, "Warm-up")[0])
    before = len(sim.requests)
    answers = await gather(asked, call)
    return answers, list(sim.requests[before:])


def assert_coalesced(
    requests: list[RequestRecord], calls: int = CALLS, most: int = MOST_REQUESTS
) -> None:
    """Every call reached the simulator as one item, in at most ``most`` requests."""
    sent = [(record.api, record.items) for record in requests]
    assert sum(record.items for record in requests) == calls, sent
    assert len(requests) <= most, sent


def _messages(ticket: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": ticket}]


def _json_schema() -> dict[str, Any]:
    schema = {**Ticket.model_json_schema(), "additionalProperties": False}
    return {
        "type": "json_schema",
        "json_schema": {"name": "ticket", "schema": schema, "strict": True},
    }


@pytest.mark.parametrize("form", ["pydantic", "json_schema"])
async def test_litellm_openai_calls_coalesce(
    sim: SimulatedProvider, gateway: Running, form: str
) -> None:
    import litellm

    response_format = Ticket if form == "pydantic" else _json_schema()
    asked = tickets()

    async def one(ticket: str) -> Ticket:
        reply = await litellm.acompletion(
            model=f"openai/{OPENAI_MODEL}", api_base=gateway.openai_url, api_key="sk-team",
            messages=_messages(ticket), response_format=response_format, num_retries=0,
        )  # fmt: skip
        return Ticket.model_validate_json(reply.choices[0].message.content)

    answers, requests = await through_gateway(sim, one, asked)
    assert answers == [expected_ticket(ticket) for ticket in asked]
    assert_coalesced(requests)


async def test_litellm_anthropic_forced_tool_calls_coalesce(
    sim: SimulatedProvider, gateway: Running
) -> None:
    # A model litellm's cost map does not know: litellm asks for the JSON through one
    # forced tool (``json_tool_call``), and turns its input back into the content.
    import litellm

    asked = tickets()

    async def one(ticket: str) -> Ticket:
        reply = await litellm.acompletion(
            model=f"anthropic/{ANTHROPIC_MODEL}", api_base=gateway.url, api_key="sk-ant-team",
            messages=_messages(ticket), response_format=Ticket, max_tokens=200, num_retries=0,
        )  # fmt: skip
        return Ticket.model_validate_json(reply.choices[0].message.content)

    answers, requests = await through_gateway(sim, one, asked)
    assert answers == [expected_ticket(ticket) for ticket in asked]
    assert_coalesced(requests)


async def test_litellm_anthropic_text_calls_coalesce(
    sim: SimulatedProvider, gateway: Running
) -> None:
    import litellm

    asked = tickets()

    async def one(ticket: str) -> str:
        reply = await litellm.acompletion(
            model=f"anthropic/{KNOWN_ANTHROPIC_MODEL}", api_base=gateway.url,
            api_key="sk-ant-team", messages=_messages(ticket), max_tokens=200, num_retries=0,
        )  # fmt: skip
        content = reply.choices[0].message.content
        assert isinstance(content, str)
        return content

    answers, requests = await through_gateway(sim, one, asked)
    assert answers == [expected_text(ticket) for ticket in asked]
    assert_coalesced(requests)


async def test_litellm_anthropic_native_structured_output_coalesces(
    sim: SimulatedProvider, gateway: Running
) -> None:
    """litellm asks a Claude model it knows for structured output with the beta
    ``output_format`` (``anthropic-beta: structured-outputs-2025-11-13``); the gateway
    reads it as ``output_config`` (``_gateway/anthropic_beta.py``), which coalesces."""
    import litellm

    asked = tickets()

    async def one(ticket: str) -> Ticket:
        reply = await litellm.acompletion(
            model=f"anthropic/{KNOWN_ANTHROPIC_MODEL}", api_base=gateway.url,
            api_key="sk-ant-team", messages=_messages(ticket), response_format=Ticket,
            max_tokens=200, num_retries=0,
        )  # fmt: skip
        return Ticket.model_validate_json(reply.choices[0].message.content)

    answers, requests = await through_gateway(sim, one, asked)
    assert len(answers) == CALLS
    assert_coalesced(requests)
    assert answers == [expected_ticket(ticket) for ticket in asked]


def _lm(gateway: Running, engine: str = "auto") -> Any:
    import dspy

    return dspy.LM(
        f"openai/{OPENAI_MODEL}", api_base=gateway.openai_url, api_key="sk-team",
        cache=False, num_retries=0, engine=engine,
    )  # fmt: skip


def _acall(program: Any) -> Callable[[str], Awaitable[Any]]:
    async def call(ticket: str) -> Any:
        return await program.acall(ticket=ticket)

    return call


def _triage(prediction: Any) -> Ticket:
    return Ticket(category=prediction.category, urgency=prediction.urgency)


@pytest.mark.parametrize("engine", ["auto", "litellm"])
async def test_dspy_json_adapter_calls_coalesce(
    sim: SimulatedProvider, gateway: Running, engine: str
) -> None:
    # JSONAdapter asks for the output fields with a json_schema response_format (the
    # model supports structured output): one user message per call, the item.
    import dspy

    program, asked = dspy.Predict(triage_signature()), tickets()
    with dspy.context(lm=_lm(gateway, engine), adapter=dspy.JSONAdapter()):
        predictions, requests = await through_gateway(sim, _acall(program), asked)
    assert [_triage(p) for p in predictions] == [expected_triage(t) for t in asked]
    assert_coalesced(requests)


async def test_dspy_batch_threads_coalesce(sim: SimulatedProvider, gateway: Running) -> None:
    # Module.batch: DSPy's own thread pool, each thread a synchronous call.
    import dspy

    program, lm = dspy.Predict(triage_signature()), _lm(gateway)

    def batch(asked: list[str]) -> Any:
        examples = [dspy.Example(ticket=ticket).with_inputs("ticket") for ticket in asked]
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            return program.batch(examples, num_threads=CALLS, disable_progress_bar=True)

    await anyio.to_thread.run_sync(batch, tickets(1, "Warm-up"))  # as through_gateway
    before, asked = len(sim.requests), tickets()
    predictions = await anyio.to_thread.run_sync(batch, asked)
    assert [_triage(p) for p in predictions] == [expected_triage(t) for t in asked]
    assert_coalesced(list(sim.requests[before:]))
