"""Misuse gets a clear error of its own, at the earliest point (issue 12, points 5 and 7).
# mypy: disable-error-code="empty-body"

Each test reproduces one misuse a new user made and checks the error: its type, that
it names the offending value and the fix, when it is raised (decoration, or the call
itself before it joins a group) and who gets it (only that caller).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from typing import Any

import anyio
import pytest

import coalesce
from coalesce import (
    BatchError,
    ConfigurationError,
    InvalidInputError,
    InvalidOutputError,
    MissingOutputError,
    ResultCountError,
)
from coalesce._validate import partition_of
from coalesce.providers import CallableProvider, Completion, CompletionRequest

pytestmark = pytest.mark.anyio

PROSE = "Sorry, I cannot help with that request. " * 10


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


class Echo:
    """A provider function answering each item with ``"out:" + its input``; logs requests."""

    def __init__(self) -> None:
        self.requests: list[CompletionRequest] = []

    def inputs(self) -> list[list[Any]]:
        """The inputs of each request, in order (a plain call's one item as sent)."""
        return [
            [i["input"] if isinstance(i, dict) else i for i in _items(request.user)]
            for request in self.requests
        ]

    async def __call__(self, request: CompletionRequest) -> str:
        self.requests.append(request)
        items = _items(request.user)
        if len(items) == 1 and not request.user.startswith('[{"id"'):
            return "out:" + request.user  # a plain call of a text output
        return json.dumps({"results": {i["id"]: "out:" + as_text(i["input"]) for i in items}})


def _items(user: str) -> list[Any]:
    try:
        packed = json.loads(user)
    except ValueError:
        return [user]
    if isinstance(packed, list) and all(isinstance(i, dict) and "id" in i for i in packed):
        return packed
    return [user]


def echo_prompt(echo: Echo, **options: Any) -> Any:
    @coalesce.prompt(
        packing="always", client=CallableProvider(echo), model="m", max_wait=1.0, **options
    )
    async def tag(text: str) -> str:
        """Tag the text."""

    return tag


async def gather(*calls: Any) -> list[Any]:
    """Await every call concurrently; each result or exception, in order."""
    results: list[Any] = [None] * len(calls)

    async def one(index: int, call: Any) -> None:
        try:
            results[index] = await call
        except Exception as exc:
            results[index] = exc

    async with anyio.create_task_group() as tg:
        for index, call in enumerate(calls):
            tg.start_soon(one, index, call)
    return results


# -- 1. @coalesce.batch: the batch function's result, and sync functions ------------------


def _results_of(kind: str, items: list[int]) -> Any:
    if kind == "generator":
        return (item * 10 for item in items)
    return {
        "dict": {item: item * 10 for item in items},
        "str": "ab",
        "bytes": b"ab",
        "set": {item * 10 for item in items},
        "frozenset": frozenset(item * 10 for item in items),
        "None": None,
        "int": 2,
    }[kind]


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("dict", "keyed, not ordered like the items"),
        ("str", "a single value, not one result per item"),
        ("bytes", "a single value, not one result per item"),
        ("set", "unordered"),
        ("frozenset", "unordered"),
        ("generator", "not a sequence"),
        ("None", "not a sequence"),
        ("int", "not a sequence"),
    ],
)
async def test_batch_result_that_is_not_a_sequence_fails_every_caller(kind: str, why: str) -> None:
    @coalesce.batch(max_wait=1.0)
    async def scale(items: list[int]) -> Any:
        return _results_of(kind, items)

    results = await gather(scale(1), scale(2))
    assert all(type(result) is BatchError for result in results), results
    message = str(results[0])
    assert message.startswith("test_batch_result_that_is_not_a_sequence_fails_every_caller.")
    assert "must return a list of results, one per item in the order of the items" in message
    assert why in message
    shown = {"None": "NoneType", "generator": "generator"}.get(kind, kind)
    assert f"it returned {shown} (" in message
    assert scale.statistics().items_failed == 2


class Column(Sequence[int]):
    """A sequence that is not a list (numpy arrays and the like)."""

    def __init__(self, values: list[int]) -> None:
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, index: Any) -> Any:
        return self._values[index]


class ArrayLike:
    """Has a length and indexing but is not registered as a Sequence (numpy's ndarray)."""

    def __init__(self, values: list[int]) -> None:
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, index: int) -> int:
        return self._values[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._values)


@pytest.mark.parametrize("wrap", [tuple, Column, ArrayLike])
async def test_batch_result_may_be_any_sequence(wrap: Any) -> None:
    @coalesce.batch(max_wait=1.0)
    async def scale(items: list[int]) -> Any:
        return wrap([item * 10 for item in items])

    assert await gather(scale(1), scale(2)) == [10, 20]


async def test_batch_sequence_of_the_wrong_length_is_a_result_count_error() -> None:
    @coalesce.batch(max_wait=1.0)
    async def short(items: list[int]) -> tuple[int, ...]:
        return (1,)

    results = await gather(short(1), short(2))
    assert all(type(result) is ResultCountError for result in results)
    assert (results[0].expected, results[0].received) == (2, 1)


def test_batch_on_a_sync_function_fails_at_decoration() -> None:
    def plain(items: list[int]) -> list[int]:
        return items

    with pytest.raises(
        ConfigurationError, match=r"async def fn\(items\).*define it with async def"
    ):
        coalesce.batch(plain)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="test_batch_on_a_sync_function_fails"):
        coalesce.batch(max_items=4)(plain)  # type: ignore[arg-type]


def test_batch_on_a_sync_resolve_early_function_fails_at_decoration() -> None:
    def early(items: list[int], resolve: Any) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"async def fn\(items, resolve\)"):
        coalesce.batch(resolve_early=True)(early)  # type: ignore[arg-type]


def test_batch_on_a_sync_method_fails_at_decoration() -> None:
    with pytest.raises(ConfigurationError, match="define it with async def"):

        class Service:
            @coalesce.batch  # type: ignore[arg-type]
            def lookup(self, items: list[int]) -> list[int]:
                return items


def test_batcher_refuses_a_sync_function_and_an_async_generator() -> None:
    def plain(items: list[int]) -> list[int]:
        return items

    async def stream(items: list[int]) -> Any:
        yield items

    for fn in (plain, stream, functools.partial(plain)):
        with pytest.raises(ConfigurationError, match="is not async"):
            coalesce.Batcher(fn)  # type: ignore[arg-type]


async def test_async_callables_of_every_shape_are_accepted() -> None:
    async def scale(factor: int, items: list[int]) -> list[int]:
        return [item * factor for item in items]

    class Scaler:
        async def __call__(self, items: list[int]) -> list[int]:
            return [item * 3 for item in items]

    def wrapper(items: list[int]) -> Any:  # a sync wrapper of an async function
        return scale(4, items)

    wrapper.__wrapped__ = functools.partial(scale, 4)  # type: ignore[attr-defined]
    for fn, factor in ((functools.partial(scale, 2), 2), (Scaler(), 3), (wrapper, 4)):
        batcher = coalesce.Batcher(fn, max_wait=1.0)
        assert await gather(batcher(1), batcher(2)) == [factor, 2 * factor]


async def test_batch_on_a_method_still_works() -> None:
    class Service:
        def __init__(self, factor: int) -> None:
            self.factor = factor

        @coalesce.batch(max_wait=1.0)
        async def scale(self, items: list[int]) -> list[int]:
            return [item * self.factor for item in items]

    assert await gather(Service(2).scale(1), Service(3).scale(1)) == [2, 3]


# -- 2. @coalesce.prompt on a method --------------------------------------------------------


async def test_prompt_on_a_method_binds_self_and_leaves_it_out_of_the_item() -> None:
    echo = Echo()

    class Tagger:
        def __init__(self, team: str) -> None:
            self.team = team

        @coalesce.prompt(
            packing="always",
            client=CallableProvider(echo),
            model="m",
            max_wait=1.0,
            partition=lambda self, text: self.team,
        )
        async def tag(self, text: str) -> str:
            """Tag the text."""

    red, blue = Tagger("red"), Tagger("blue")
    assert await gather(red.tag("a"), blue.tag("b"), red.tag(text="c")) == [
        "out:a",
        "out:b",
        "out:c",
    ]
    # One request per partition (the instance's team); self is in no item.
    assert sorted(sorted(inputs) for inputs in echo.inputs()) == [["a", "c"], ["b"]]
    assert "Tagger" not in "".join(request.user for request in echo.requests)
    # Every instance shares the function's one engine and its statistics.
    assert isinstance(Tagger.tag, coalesce.PromptFunction)
    assert Tagger.tag.statistics().calls == red.tag.statistics().calls == 3


async def test_prompt_method_with_several_parameters_and_a_formatting_body() -> None:
    echo = Echo()

    class Reviews:
        prefix = "review"

        @coalesce.prompt(packing="always", client=CallableProvider(echo), model="m")
        async def fields(self, title: str, stars: int) -> str:
            """Summarise the review."""

        @coalesce.prompt(packing="always", client=CallableProvider(echo), model="m")
        async def formatted(self, title: str, stars: int) -> str:
            """Summarise the review."""
            return f"{self.prefix}: {title} ({stars}/5)"

    reviews = Reviews()
    assert await reviews.fields("Dune", 5) == 'out:{"title":"Dune","stars":5}'
    assert await reviews.formatted("Dune", stars=5) == "out:review: Dune (5/5)"


# -- 3. the return annotation -----------------------------------------------------------


def test_none_or_missing_return_annotation_fails_at_decoration() -> None:
    decorate = coalesce.prompt(packing="always", client=CallableProvider(Echo()), model="m")

    async def returns_none(text: str) -> None:
        """Tag it."""

    async def unannotated(text: str):  # type: ignore[no-untyped-def]
        """Tag it."""

    with pytest.raises(ConfigurationError, match=r"returns_none is annotated -> None.*-> str"):
        decorate(returns_none)
    with pytest.raises(ConfigurationError, match=r"unannotated has no return annotation.*-> str"):
        decorate(unannotated)


# -- 4. misspelt options, request options and the new options -------------------------------


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("max_item", "max_items"),
        ("latancy_budget", "latency_budget"),
        ("max_wiat", "max_wait"),
        ("time_out", "timeout"),
        ("dedup", "dedupe"),
        ("instruction", "instructions"),
        ("context_windows", "context_window"),
    ],
)
def test_a_misspelt_option_fails_at_decoration(typo: str, meant: str) -> None:
    misspelt: dict[str, Any] = {typo: 8}
    with pytest.raises(ConfigurationError) as info:
        coalesce.prompt(packing="always", client=CallableProvider(Echo()), model="m", **misspelt)
    assert str(info.value).startswith(f"unknown option {typo!r}: did you mean {meant!r}?")


async def test_request_options_still_reach_the_provider() -> None:
    echo = Echo()
    options = {
        "temperature": 0,
        "top_p": 0.5,
        "seed": 7,
        "user": "u-1",
        "metadata": {"team": "red"},
        "max_tokens": 100,
        "stop": ["\n"],
    }
    tag = echo_prompt(echo, **options)
    assert await tag("a") == "out:a"
    assert dict(echo.requests[0].options) == options


def test_timeout_context_window_and_schema_enforced_are_options() -> None:
    tag = echo_prompt(Echo(), timeout=2.5, context_window=8000, schema_enforced=True)
    options = tag._engine.options
    assert (options.timeout, options.context_window, options.schema_enforced) == (
        2.5,
        8000,
        True,
    )
    for bad, match in (
        ({"timeout": 0}, "timeout must be a finite number of seconds > 0"),
        ({"context_window": 0}, "context_window must be an integer >= 1"),
        ({"schema_enforced": "yes"}, "schema_enforced must be True, False or None"),
    ):
        with pytest.raises(ConfigurationError, match=match):
            coalesce.prompt(packing="always", client=CallableProvider(Echo()), model="m", **bad)


# -- 5. items that cannot be sent ----------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "kind", "field"),
    [
        (b"\xff\xfe", "is bytes, which a prompt cannot carry", "$"),
        (b"valid utf-8", "is bytes, which a prompt cannot carry", "$"),
        (object(), "is of type object (<object object at", "$"),
        ({"ok": 1, "blob": [1, b"x"]}, "at $.blob[1] is bytes", "$.blob[1]"),
        (
            {"ok": 1, "what": {"deep": {1, object()}}},
            "at $.what.deep is of type set",
            "$.what.deep",
        ),
    ],
)
async def test_an_item_that_cannot_be_sent_fails_only_its_caller_at_once(
    item: Any, kind: str, field: str
) -> None:
    echo = Echo()
    tag = echo_prompt(echo)
    started = anyio.current_time()
    with pytest.raises(InvalidInputError) as info:
        await tag(item)
    assert anyio.current_time() == started  # at once: it never waited for company
    assert echo.requests == []  # the provider never saw it
    assert str(info.value).startswith("echo_prompt.<locals>.tag: argument 'text' ")
    assert kind in str(info.value)
    assert info.value.field == field
    # Its neighbours are unaffected.
    results = await gather(tag("a"), tag(item), tag("b"))
    assert results[0] == "out:a"
    assert isinstance(results[1], InvalidInputError)
    assert results[2] == "out:b"
    assert [sorted(inputs) for inputs in echo.inputs()] == [["a", "b"]]


async def test_an_unsendable_argument_among_several_names_its_field() -> None:
    echo = Echo()

    @coalesce.prompt(packing="always", client=CallableProvider(echo), model="m")
    async def review(title: str, cover: Any) -> str:
        """Summarise the review."""

    with pytest.raises(InvalidInputError, match=r"argument 'cover' is bytes") as info:
        await review("Dune", b"\x89PNG")
    assert info.value.field == "$.cover"

    @coalesce.prompt(packing="always", client=CallableProvider(echo), model="m")
    async def formatted(title: str) -> str:
        """Summarise the review."""
        return {"title": title, "when": object()}  # type: ignore[return-value]

    with pytest.raises(InvalidInputError, match=r"the value its body returned at \$\.when"):
        await formatted("Dune")
    assert echo.requests == []


# -- 6. a provider function returning something else -------------------------------------


@pytest.mark.parametrize(
    ("reply", "shown"),
    [
        (42, "returned int 42;"),
        ({"text": "hi"}, "returned dict {'text': 'hi'};"),
        (Completion(text=None, finish_reason="stop"), "a Completion whose text is NoneType"),  # type: ignore[arg-type]
    ],
)
async def test_a_provider_function_returning_a_non_string_is_a_configuration_error(
    reply: Any, shown: str
) -> None:
    async def model(request: CompletionRequest) -> Any:
        return reply

    @coalesce.prompt(packing="always", client=CallableProvider(model), model="m", max_wait=1.0)
    async def tag(text: str) -> str:
        """Tag the text."""

    results = await gather(tag("a"), tag("b"))
    assert all(type(result) is ConfigurationError for result in results)
    message = str(results[0])
    assert "the provider function " in message
    assert shown in message
    assert "must return the reply text (a str) or a coalesce.providers.Completion" in message


# -- 7. prose instead of JSON ---------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_prose_from_the_provider_shows_the_reply_not_an_internal_id(stream: bool) -> None:
    async def chatty(request: CompletionRequest) -> str:
        return PROSE

    @coalesce.prompt(
        packing="always", client=CallableProvider(chatty), model="m", stream=stream, max_wait=1.0
    )
    async def count(text: str) -> int:
        """Count the words."""

    results = await gather(count("a"), count("b"))
    for error in results:
        # The last attempts ask each alone, as a plain call, whose reply was not JSON.
        assert type(error) is InvalidOutputError
        message = str(error)
        assert message.startswith("the reply was not JSON (the reply began: ")
        assert repr(PROSE[:200]) + "...)" in message
        assert message.endswith("; gave up after 4 attempts")
        assert "item '" not in message
        assert "id '" not in message
        assert error.item_id == "1"  # kept as an attribute (the id in its last request)
        assert error.attempts == 4


async def test_prose_to_a_packed_request_says_the_call_had_no_result() -> None:
    async def chatty(request: CompletionRequest) -> str:
        return PROSE

    @coalesce.prompt(
        packing="always", client=CallableProvider(chatty), model="m", max_wait=1.0, max_attempts=1
    )
    async def count(text: str) -> int:
        """Count the words."""

    for error in await gather(count("a"), count("b")):
        assert type(error) is MissingOutputError
        assert str(error).startswith("the reply had no result for this call (the reply began: ")
        assert (error.raw, error.attempts) == (None, 1)


# -- 9. options of the wrong kind -----------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ({"stream": "no"}, "stream must be True or False, got 'no'"),
        ({"dedupe": 1}, "dedupe must be True or False, got 1"),
        ({"on_event": 42}, "on_event must be a callable or None, got 42"),
        ({"partition": "team"}, "partition must be a callable or None, got 'team'"),
    ],
)
def test_options_of_the_wrong_kind_fail_before_decorating(
    option: dict[str, Any], match: str
) -> None:
    async def tag(text: str) -> str:
        """Tag the text."""

    with pytest.raises(ConfigurationError, match=match):
        coalesce.prompt(packing="always", client=CallableProvider(Echo()), model="m", **option)(tag)


# -- 8. the command line --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--port", "70000"], "argument --port: must be from 0 to 65535"),
        (["simulate", "--port", "-1"], "argument --port: must be from 0 to 65535"),
        (["simulate", "--port", "http"], "argument --port: must be an integer from 0 to 65535"),
        (["simulate", "--time-scale", "0"], "argument --time-scale: must be a finite number > 0"),
        (["simulate", "--time-scale", "nan"], "argument --time-scale: must be a finite number"),
    ],
)
def test_bad_command_line_arguments_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from coalesce.cli import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"coalesce simulate: error: {message}" in err
    assert "Traceback" not in err


def test_a_bad_configuration_value_is_a_one_line_error(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from coalesce.cli import main

    config = tmp_path / "sim.json"
    config.write_text('{"time_scale": "fast"}')
    assert main(["simulate", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"coalesce simulate: invalid configuration in {config}: ")
    assert err.count("\n") == 1


def test_a_value_argparse_let_through_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # ``coalesce demo --budget inf``: argparse takes inf as a float, the decorator refuses it.
    import coalesce._demo
    from coalesce.cli import main

    def demo(argv: list[str]) -> int:
        assert argv == ["--budget", "inf"]
        coalesce.prompt(
            packing="always",
            client=CallableProvider(Echo()),
            model="m",
            latency_budget=float("inf"),
        )
        return 0

    monkeypatch.setattr(coalesce._demo, "main", demo)
    assert main(["demo", "--budget", "inf"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "coalesce demo: error: latency_budget must be a finite number of seconds > 0 or None,"
        " got inf\n"
    )


async def test_a_partition_function_that_fails_fails_only_its_own_call() -> None:
    echo = Echo()

    def by_tenant(text: str) -> Any:
        if text == "bad":
            raise KeyError("tenant")
        return [text] if text == "list" else "acme"

    tag = echo_prompt(echo, partition=by_tenant)
    results = await gather(tag("a"), tag("bad"), tag("list"), tag("b"))
    assert results[0] == "out:a"
    assert results[3] == "out:b"
    for failed in results[1:3]:
        assert isinstance(failed, coalesce.ConfigurationError)
        assert "partition function" in str(failed)
        assert "by_tenant" in str(failed)
    assert isinstance(results[1].__cause__, KeyError)
    assert [sorted(inputs) for inputs in echo.inputs()] == [["a", "b"]]


def test_one_rule_checks_what_a_partition_function_returns() -> None:
    def by_tenant(text: str, *, tenant: Any = None) -> Any:
        return {"a": 1}[text] if tenant is None else tenant

    assert partition_of(by_tenant, ("a",), receives="the call's arguments") == 1
    assert partition_of(by_tenant, ("x",), {"tenant": ("t", 1)}, receives="...") == ("t", 1)
    with pytest.raises(ConfigurationError, match="by_tenant raised KeyError") as raised:
        partition_of(by_tenant, ("b",), receives="the call's arguments")
    assert "it receives the call's arguments and must return a hashable key" in str(raised.value)
    assert isinstance(raised.value.__cause__, KeyError)
    with pytest.raises(ConfigurationError, match=r"returned \['t'\], which is not hashable"):
        partition_of(by_tenant, ("x",), {"tenant": ["t"]}, receives="the call's arguments")
