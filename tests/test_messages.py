"""What a caller is told when a call does not fit its ``@coalesce.prompt`` function:
arguments checked against the signature and the annotations, keys JSON cannot write,
a bare decorator, and warnings that point at the user's own line."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import coalesce
from coalesce.testing import SimulatedProvider

pytestmark = pytest.mark.anyio


def _tag(provider: SimulatedProvider) -> Any:
    @coalesce.prompt(client=provider.openai_client(max_retries=0), model="sim-1", packing="always")
    async def tag(ticket: str, priority: int = 0) -> str:
        """Tag the support ticket with one word."""

    return tag


@pytest.mark.parametrize("value", [42, None, ["a list"]])
async def test_an_argument_of_the_wrong_type_is_refused_naming_function_and_parameter(
    value: Any,
) -> None:
    provider = SimulatedProvider()
    tag = _tag(provider)
    with pytest.raises(coalesce.InvalidInputError) as caught:
        await tag(value)
    message = str(caught.value)
    assert message.startswith("_tag.<locals>.tag: ")  # the function's name
    assert "argument 'ticket' must be str" in message
    assert repr(value)[:10] in message
    assert caught.value.field == "$.ticket"
    assert provider.statistics().requests == 0


async def test_lax_values_pass_and_are_sent_as_given() -> None:
    provider = SimulatedProvider()
    tag = _tag(provider)
    assert isinstance(await tag("printer on fire", "3"), str)  # "3" is a valid int, laxly
    assert provider.statistics().requests == 1


async def test_a_misspelt_keyword_names_the_function_and_the_parameter_it_misspells() -> None:
    tag = _tag(SimulatedProvider())
    with pytest.raises(TypeError) as caught:
        await tag(text="hi")
    message = str(caught.value)
    assert "tag() got arguments that do not fit it" in message
    assert "'text' (did you mean 'ticket'?)" in message
    assert "missing a required argument: 'ticket'" in message
    assert "call it as tag(ticket, priority=0)" in message


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ({(1, 2): "x"}, "tuple key (1, 2)"),
        ({1: "a", "1": "b"}, 'one key "1"'),
    ],
)
async def test_keys_json_cannot_write_faithfully_are_refused(item: Any, words: str) -> None:
    provider = SimulatedProvider()

    @coalesce.prompt(client=provider.openai_client(max_retries=0), model="sim-1", packing="always")
    async def sort(record: dict[Any, Any]) -> str:
        """Sort the record."""

    with pytest.raises(coalesce.InvalidInputError) as caught:
        await sort(item)
    assert words in str(caught.value)
    assert provider.statistics().requests == 0


async def test_distinct_mixed_type_keys_are_sent_as_json_writes_them() -> None:
    provider = SimulatedProvider()

    @coalesce.prompt(client=provider.openai_client(max_retries=0), model="sim-1", packing="always")
    async def sort(record: dict[Any, Any]) -> str:
        """Sort the record."""

    await sort({1: "a", "b": 2})
    assert provider.statistics().requests == 1


def test_a_bare_decorator_says_how_to_call_it() -> None:
    with pytest.raises(coalesce.ConfigurationError) as caught:

        @coalesce.prompt  # type: ignore[arg-type,call-overload]
        async def tag(ticket: str) -> str:
            """Tag it."""

    assert "@coalesce.prompt needs its options, in parentheses" in str(caught.value)
    assert "tag" in str(caught.value)


def test_the_packing_warning_points_at_the_decorated_function_in_user_code() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        @coalesce.prompt(client=SimulatedProvider().openai_client(), model="sim-1")
        async def tiny(ticket: str) -> str:
            """Tag."""

    (warning,) = [w for w in caught if issubclass(w.category, coalesce.CoalesceWarning)]
    assert "packing cannot pay" in str(warning.message)
    assert warning.filename == __file__
