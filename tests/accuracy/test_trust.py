"""No answer is handed over that the rest of its reply contradicts (issue 12, point 1).

A scripted provider streams replies chunk by chunk on virtual time. Against one that
does not enforce the reply schema, answers are held until the reply ends and a
duplicated id (wrong answer first) is asked again; against one declared to enforce
it, answers stream early, and a contradiction is counted, logged and ends the trust.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import openai
import pytest
from pydantic import BaseModel

import coalesce
from coalesce._accuracy.trust import SchemaTrust, declared_enforcement, schema_broken
from coalesce._wire.packing import split_reply
from coalesce.providers import (
    AnthropicProvider,
    Completion,
    CompletionRequest,
    OpenAICompatibleProvider,
    OpenAIProvider,
    RetryAdvice,
    Usage,
)

pytestmark = pytest.mark.anyio


class Label(BaseModel):
    label: str


Writer = Callable[[list[str]], list[tuple[str, str]]]  # ids -> (id, label) in writing order


class ScriptedProvider:
    """Streams each packed reply one result at a time, 0.1 s apart; ``writers`` say, per
    request in turn, which (id, label) pairs to write (default: every id, right label)."""

    name = "scripted"
    structured = True

    def __init__(self, writers: Sequence[Writer] = (), *, enforces_schema: bool = False) -> None:
        self.enforces_schema = enforces_schema
        self.writers = list(writers)
        self.requests: list[CompletionRequest] = []
        self.ended: list[float] = []

    async def complete(
        self, request: CompletionRequest, on_text: Callable[[str], None] | None = None
    ) -> Completion:
        self.requests.append(request)
        if not request.user.startswith("["):  # a group of one, asked as a plain call
            text = json.dumps({"label": request.user.strip('"')})
            await anyio.sleep(0.1)
            return Completion(text, "stop", usage=Usage(50, 5), seconds=0.1)
        items = {i["id"]: i["input"] for i in json.loads(request.user)}
        writer = self.writers.pop(0) if self.writers else right
        chunks = ['{"results": {']
        for n, (item_id, label) in enumerate(writer(list(items))):
            answer = label.replace("ITEM", items.get(item_id, "?"))
            chunks.append(("," if n else "") + json.dumps(item_id) + ": " + answer)
        chunks.append("}}")
        for chunk in chunks:
            await anyio.sleep(0.1)
            if on_text is not None:
                on_text(chunk)
        self.ended.append(anyio.current_time())
        return Completion("".join(chunks), "stop", usage=Usage(100, 10), seconds=0.1)

    def advise(self, error: BaseException) -> RetryAdvice:
        return RetryAdvice(retry=False)


def right(ids: list[str]) -> list[tuple[str, str]]:
    return [(i, '{"label": "ITEM"}') for i in ids]


def wrong_first(ids: list[str]) -> list[tuple[str, str]]:
    """The first id twice: a wrong answer first, the right one last."""
    return [(ids[0], '{"label": "WRONG"}'), *right(ids)]


def missing_last(ids: list[str]) -> list[tuple[str, str]]:
    return right(ids)[:-1]


def tagger(provider: ScriptedProvider, **options: Any) -> Any:
    @coalesce.prompt(
        packing="always", client=provider, model="m", max_items=4, max_wait=0.01, **options
    )
    async def tag(text: str) -> Label:
        """Label the text with itself."""

    return tag


async def call_all(
    tag: Any, texts: list[str], *, close: bool = True
) -> tuple[list[Any], list[float]]:
    results: list[Any] = [None] * len(texts)
    times: list[float] = [0.0] * len(texts)

    async def one(n: int) -> None:
        results[n] = (await tag(texts[n])).label
        times[n] = anyio.current_time()

    async with anyio.create_task_group() as tg:
        for n in range(len(texts)):
            tg.start_soon(one, n)
    if close:
        await tag.aclose()
    return results, times


async def test_a_duplicate_written_wrong_first_never_reaches_its_caller() -> None:
    provider = ScriptedProvider([wrong_first])  # does not enforce the schema
    tag = tagger(provider)
    results, times = await call_all(tag, ["a", "b", "c", "d"])
    assert results == ["a", "b", "c", "d"]
    # The duplicated id failed the complete reply and was asked again, alone.
    assert len(json.loads(provider.requests[0].user)) == 4
    assert len(provider.requests) == 2  # ... and the second request was a plain call
    # Nobody was answered before the first reply ended.
    assert min(times) >= provider.ended[0]
    assert tag.statistics().contradictions == 0


async def test_answers_are_held_until_the_reply_ends_without_enforcement() -> None:
    provider = ScriptedProvider()
    results, times = await call_all(tagger(provider), ["a", "b", "c", "d"])
    assert results == ["a", "b", "c", "d"]
    assert set(times) == {provider.ended[0]}


async def test_answers_stream_early_from_a_provider_that_enforces_the_schema() -> None:
    provider = ScriptedProvider(enforces_schema=True)
    results, times = await call_all(tagger(provider), ["a", "b", "c", "d"])
    assert results == ["a", "b", "c", "d"]
    assert min(times) < provider.ended[0]  # the first answer before the reply's end
    assert len(set(times)) > 1


async def test_schema_enforced_false_holds_answers_even_from_an_enforcing_provider() -> None:
    provider = ScriptedProvider(enforces_schema=True)
    _results, times = await call_all(tagger(provider, schema_enforced=False), ["a", "b", "c"])
    assert set(times) == {provider.ended[0]}


async def test_a_contradiction_is_reported_and_ends_the_trust() -> None:
    events: list[Any] = []
    provider = ScriptedProvider([wrong_first], enforces_schema=True)  # it lied
    tag = tagger(provider, on_event=events.append)
    results, _times = await call_all(tag, ["a", "b", "c", "d"], close=False)
    await anyio.sleep(1)  # the reply ends
    # The first id's caller got the wrong answer, streamed before the duplicate: that
    # is what trusting costs, and why only enforcing providers are trusted.
    assert results.count("WRONG") == 1
    assert tag.statistics().contradictions == 1
    assert [e.ids for e in events if isinstance(e, coalesce.ContradictionEvent)] == [("1",)]
    assert not tag._engine.trust.enforced
    # From then on, answers wait for the reply's end.
    results, times = await call_all(tag, ["e", "f", "g"])
    assert results == ["e", "f", "g"]
    assert set(times) == {provider.ended[-1]}


async def test_a_reply_that_breaks_the_schema_ends_the_trust() -> None:
    provider = ScriptedProvider([missing_last], enforces_schema=True)
    tag = tagger(provider)
    results, _times = await call_all(tag, ["a", "b", "c"])
    assert results == ["a", "b", "c"]  # the missing one was asked again
    assert not tag._engine.trust.enforced
    assert tag.statistics().contradictions == 0


async def test_statistics_count_requests_while_answers_stream() -> None:
    provider = ScriptedProvider(enforces_schema=True)
    tag = tagger(provider)
    seen: list[tuple[int, int]] = []

    async def one(text: str) -> None:
        await tag(text)
        stats = tag.statistics()
        seen.append((stats.requests, stats.requests_in_flight))

    async with anyio.create_task_group() as tg:
        for text in "abcdefgh":  # two groups of four, answered mid-stream
            tg.start_soon(one, text)
    assert len(seen) == 8
    assert all(requests == 2 for requests, _ in seen)
    assert all(in_flight >= 1 for _, in_flight in seen)  # read before the replies ended
    await tag.aclose()
    stats = tag.statistics()
    assert (stats.requests, stats.requests_in_flight, stats.items_per_request) == (2, 0, 4.0)


def test_only_openai_with_strict_schemas_is_taken_to_enforce_them() -> None:
    def provider(base_url: str, **options: Any) -> OpenAIProvider:
        return OpenAIProvider(openai.AsyncOpenAI(api_key="k", base_url=base_url), **options)

    assert provider("https://api.openai.com/v1").enforces_schema
    assert provider("https://me.openai.azure.com/openai").enforces_schema
    assert not provider("https://api.openai.com/v1", strict=False).enforces_schema
    assert not provider("http://127.0.0.1:8080/v1").enforces_schema
    assert provider("http://127.0.0.1:8080/v1", enforces_schema=True).enforces_schema
    assert not OpenAICompatibleProvider("http://127.0.0.1:8080").enforces_schema


def test_the_option_overrides_the_declaration_unless_the_schema_is_not_sent() -> None:
    enforcing = ScriptedProvider(enforces_schema=True)
    assert declared_enforcement(enforcing, None)
    assert not declared_enforcement(enforcing, False)
    assert declared_enforcement(ScriptedProvider(), True)
    unstructured = OpenAICompatibleProvider("http://127.0.0.1:8080", structured=False)
    assert not declared_enforcement(unstructured, True)  # the schema is only described


def test_anthropic_is_not_taken_to_enforce_a_forced_tool() -> None:
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.AsyncAnthropic(api_key="k")
    assert not AnthropicProvider(client).enforces_schema
    assert AnthropicProvider(client, enforces_schema=True).enforces_schema


@pytest.mark.parametrize(
    ("reply", "broken"),
    [
        ('{"results": {"1": {"label": "a"}, "2": {"label": "b"}}}', False),
        ('{"results": {"1": {"label": "a"}, "1": {"label": "x"}, "2": {"label": "b"}}}', True),
        ('{"results": {"1": {"label": "a"}, "1": {"label": "a"}, "2": {"label": "b"}}}', False),
        ('{"results": {"1": {"label": "a"}}}', True),  # an id missing
        ('{"results": {"1": {"label": "a"}, "2": {"label": "b"}, "9": {"label": "c"}}}', True),
        ('{"results": {"1": {"label": "a"}, "2": {"label": 7}}}', False),  # invalid, not broken
    ],
)
def test_schema_broken(reply: str, broken: bool) -> None:
    split = split_reply(reply, ("1", "2"), Label.model_validate)
    assert schema_broken(split) is broken


def test_a_truncated_reply_does_not_break_the_schema() -> None:
    split = split_reply('{"results": {"1": {"label": "a"}', ("1", "2"), Label.model_validate)
    assert not schema_broken(split)


def test_schema_trust_starts_from_the_declaration() -> None:
    assert SchemaTrust(True).enforced
    assert not SchemaTrust(False).enforced
