"""A caller's ``max_tokens`` is a cap on its own answer, not a forecast of it.

Frameworks send large caps by default (pydantic-ai sends a Claude model's whole output
limit, 64,000 for Haiku 4.5). A packed request asks what its items are expected to
need, at least one caller's cap and never more than the model writes or its window
holds; a request of one call asks exactly the caller's cap, as the plain call does. So
no call is refused that the plain call would not be: the simulator refuses, as the
real APIs do, a ``max_tokens`` above the model's output limit and a prompt plus
``max_tokens`` past its window.

The pure rule first, with hand-built numbers; then 40 wrapped calls end to end.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from coalesce import wrap
from coalesce._planning.context import ContextWindow, known_output_limit, output_limit_error
from coalesce._planning.output import REQUEST_HEADROOM, request_output_cap
from coalesce.testing import SimulatedProvider

# -- the rule ------------------------------------------------------------------------


def test_a_request_of_one_asks_exactly_the_callers_cap() -> None:
    for cap in (1, 200, 64_000):
        assert (
            request_output_cap(1, item_cap=cap, configured=100, expected=10, model_limit=50) == cap
        )


def test_a_packed_request_asks_what_its_items_need_not_every_cap() -> None:
    # 20 callers at 64,000 each expect 25 tokens: one caller's cap is room enough.
    assert request_output_cap(20, item_cap=64_000, configured=None, expected=500) == 64_000
    # Small caps: the group needs more than one cap, never more than their sum.
    assert request_output_cap(20, item_cap=50, configured=None, expected=500) == 1000
    assert request_output_cap(4, item_cap=50, configured=None, expected=500) == 200
    assert request_output_cap(20, item_cap=50, configured=None, expected=300) == (
        REQUEST_HEADROOM * 300
    )


def test_a_packed_request_stays_within_the_models_limits() -> None:
    asked = request_output_cap(
        20, item_cap=8_000, configured=None, expected=6_000, model_limit=10_000
    )
    assert asked == 10_000
    asked = request_output_cap(
        20, item_cap=8_000, configured=None, expected=6_000, model_limit=None, room=9_000
    )
    assert asked == 9_000
    asked = request_output_cap(20, item_cap=8_000, configured=7_000, expected=100)
    assert asked == 7_000


def test_without_a_callers_cap_the_functions_own_applies() -> None:
    assert request_output_cap(5, item_cap=None, configured=300, expected=10) == 300
    assert request_output_cap(5, item_cap=None, configured=None, expected=10) is None


def test_known_output_limits() -> None:
    assert known_output_limit("claude-haiku-4-5") == 64_000
    assert known_output_limit("claude-haiku-4-5-20251001") == 64_000
    assert known_output_limit("claude-3-5-haiku-latest") == 8_192
    assert known_output_limit("gpt-4o-mini") == 16_384
    assert known_output_limit("my-local-model") is None


@pytest.mark.parametrize(
    ("message", "limit"),
    [
        (
            "max_tokens is too large: 320000. This model supports at most 16384 completion"
            " tokens, whereas you provided 320000.",
            16_384,
        ),
        (
            "max_tokens: 1280000 > 64000, which is the maximum allowed number of output"
            " tokens for claude-haiku-4-5",
            64_000,
        ),
        ("max_tokens must be at most 4096", 4_096),
        ("This model's maximum context length is 8192 tokens.", None),
    ],
)
def test_the_output_limit_a_refusal_states(message: str, limit: int | None) -> None:
    assert output_limit_error(RuntimeError(message)) == limit


def test_a_window_learns_the_output_limit_from_a_refusal() -> None:
    window = ContextWindow("my-local-model")
    assert window.output_limit is None
    refused = RuntimeError("max_tokens must be at most 4096")
    assert window.learn(refused)
    assert window.output_limit == 4_096
    assert window.limit is None  # it said nothing of the context window


# -- end to end ------------------------------------------------------------------------

CALLS = 40
INSTRUCTIONS = "Answer the customer's message in one short sentence. " * 20


async def _ask_all(client: Any, sdk: str, model: str, max_tokens: int) -> list[str]:
    answers: dict[int, str] = {}

    async def one(index: int) -> None:
        text = f"message {index}: where is my parcel?"
        if sdk == "openai":
            reply = await client.chat.completions.create(
                model=model,
                max_tokens=max_tokens,
                messages=[
                    {"role": "system", "content": INSTRUCTIONS},
                    {"role": "user", "content": text},
                ],
            )
            answers[index] = str(reply.choices[0].message.content)
        else:
            message = await client.messages.create(
                model=model,
                max_tokens=max_tokens,
                system=INSTRUCTIONS,
                messages=[{"role": "user", "content": text}],
            )
            answers[index] = str(message.content[0].text)

    async with anyio.create_task_group() as tg:
        for index in range(CALLS):
            tg.start_soon(one, index)
    return [answers[index] for index in range(CALLS)]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("sdk", "model", "limit", "window"),
    [
        pytest.param("anthropic", "claude-haiku-4-5", 64_000, 200_000, id="haiku-4-5"),
        pytest.param("openai", "gpt-4o-mini", 16_384, 128_000, id="gpt-4o-mini"),
        # Not in coalesce's tables: nothing known of the model but what it says.
        pytest.param("openai", "my-local-model", 4_096, 8_192, id="unknown-model"),
        pytest.param("anthropic", "my-local-model", 4_096, 8_192, id="unknown-anthropic"),
    ],
)
async def test_calls_at_the_models_maximum_are_packed_never_refused(
    sdk: str, model: str, limit: int, window: int
) -> None:
    sim = SimulatedProvider(output_limit={model: limit}, context_window={model: window})
    plain = sim.openai_client(max_retries=0) if sdk == "openai" else sim.anthropic_client()
    async with wrap(plain, latency_budget=5.0, max_items=20) as client:
        answers = await _ask_all(client, sdk, model, max_tokens=limit)
    texts = [f"message {index}: where is my parcel?" for index in range(CALLS)]
    assert answers == [sim.expected_output(text) for text in texts]
    assert [record.status for record in sim.requests] == [200] * len(sim.requests)
    assert len(sim.requests) <= 10
    assert max(record.items for record in sim.requests) > 1
