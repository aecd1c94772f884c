"""Context windows: the simulator refuses a request too long for its model, as real APIs do."""

from __future__ import annotations

import pytest

from coalesce._exceptions import ConfigurationError
from coalesce.testing import SimulatedProvider
from coalesce.testing._context import check_windows, refusal, window_for

MODEL = "gpt-4o-mini"
CLAUDE = "claude-3-5-haiku-latest"
LONG = "river stone light " * 200  # some 600 tokens


def test_refusal_messages_are_the_providers_own() -> None:
    assert refusal("openai.chat", 1000, 990, None) is None
    assert refusal("openai.chat", 1000, 900, 100) is None
    openai_message = refusal("openai.chat", 1000, 900, 200)
    assert openai_message is not None
    assert openai_message.startswith("This model's maximum context length is 1000 tokens.")
    assert (
        "you requested 1100 tokens (900 in the messages, 200 in the completion)" in openai_message
    )
    assert refusal("anthropic.messages", 1000, 1200, 10) == (
        "prompt is too long: 1200 tokens > 1000 maximum"
    )
    both = refusal("anthropic.messages", 1000, 900, 200)
    assert both is not None
    assert both.startswith("input length and `max_tokens` exceed context limit: 900 + 200 > 1000")


def test_windows_per_model_or_for_all() -> None:
    assert window_for(None, MODEL) is None
    assert window_for(4096, MODEL) == 4096
    assert window_for({MODEL: 128_000}, MODEL) == 128_000
    assert window_for({MODEL: 128_000}, CLAUDE) is None


@pytest.mark.parametrize("bad", [0, -5, True, 1.5, "128k", {MODEL: 0}, {MODEL: "x"}])
def test_invalid_windows_are_refused(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="context_window must be a positive number"):
        check_windows(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="context_window"):
        SimulatedProvider.from_config({"context_window": bad})


def test_configuration_key() -> None:
    sim = SimulatedProvider.from_config({"context_window": {MODEL: 128_000}})
    assert sim.context_window == {MODEL: 128_000}
    assert SimulatedProvider().context_window is None


@pytest.mark.anyio
async def test_openai_request_too_long_is_refused_and_logged() -> None:
    import openai

    sim = SimulatedProvider(context_window={MODEL: 300})
    async with sim.openai_client(max_retries=0) as client:
        short = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        assert short.choices[0].message.content == sim.expected_output("hi")
        with pytest.raises(openai.BadRequestError, match="maximum context length is 300") as info:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": LONG}]
            )
        # Another model has no window here.
        await client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": LONG}]
        )
    assert info.value.code == "context_length_exceeded"
    assert [r.status for r in sim.requests] == [200, 400, 200]
    assert sim.requests[1].completion_tokens == 0


@pytest.mark.anyio
async def test_anthropic_request_too_long_is_refused() -> None:
    import anthropic

    sim = SimulatedProvider(context_window=300)
    async with sim.anthropic_client(max_retries=0) as client:
        with pytest.raises(
            anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > 300"
        ):
            await client.messages.create(
                model=CLAUDE, max_tokens=10, messages=[{"role": "user", "content": LONG}]
            )
        with pytest.raises(anthropic.BadRequestError, match="exceed context limit"):
            await client.messages.create(
                model=CLAUDE, max_tokens=400, messages=[{"role": "user", "content": "hi"}]
            )
    assert [r.status for r in sim.requests] == [400, 400]
