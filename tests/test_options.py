"""The options model (issue 36): every option is defined once, in
``coalesce._options.OPTIONS``, and every surface that takes it (``prompt``'s and
``wrap``'s signatures, the batcher's, ``coalesce serve``'s flags, variables and
settings, the request headers, the engine's ``Options``) and every docs table of options
agrees with it. A surface that defaults otherwise must say why in the model."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import coalesce
from coalesce._engine.spec import Options
from coalesce._gateway.config import GatewayConfig, build_parser
from coalesce._options import NOT_GIVEN, OPTIONS, Option, on
from coalesce._wrap.headers import HEADERS, SWITCH_HEADER
from coalesce.testing import SimulatedProvider

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: Each surface's keywords, read from the code.
SIGNATURES: dict[str, Callable[..., Any]] = {
    "prompt": coalesce.prompt,
    "wrap": coalesce.wrap,
    "batch": coalesce.Batcher.__init__,
}
#: The gateway's settings that are no option: secrets read from the environment.
_SECRETS = {"openai_api_key", "anthropic_api_key"}


def _keywords(function: Callable[..., Any]) -> dict[str, Any]:
    parameters = inspect.signature(function).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is p.KEYWORD_ONLY}


def _same(value: Any, default: Any) -> bool:
    return value is default or (type(value) is type(default) and value == default)


def _names(surface: str) -> set[str]:
    return {option.name for option in on(surface)}


# -- every surface takes exactly the model's options ---------------------------------


@pytest.mark.parametrize("surface", sorted(SIGNATURES))
def test_each_signature_takes_the_options_of_its_surface(surface: str) -> None:
    assert set(_keywords(SIGNATURES[surface])) == _names(surface)


def test_the_gateway_has_a_flag_variable_and_setting_per_serve_option() -> None:
    actions = [a for a in build_parser()._actions if a.dest not in ("help", "config")]
    assert {a.option_strings[0] for a in actions} == {o.flag for o in on("serve")}
    assert {a.dest for a in actions} == {o.setting for o in on("serve")}
    settings = {f.name for f in dataclasses.fields(GatewayConfig)} - _SECRETS
    assert settings == {o.setting for o in on("serve")}
    assert all(o.variable == "COALESCE_" + o.setting.upper() for o in on("serve"))


def test_the_engine_options_and_the_headers_are_the_models() -> None:
    engine = {f.name for f in dataclasses.fields(Options)} - {"item_output_cap"}
    named = _names("prompt") | _names("wrap")
    fleet = {"fleet", "fleet_creds", "fleet_tls_ca"}  # where the engine runs, not how
    assert engine == named - {"client", "model", "instructions", "partition", *fleet}
    assert {o.header for o in OPTIONS if o.header} == set(HEADERS) - {SWITCH_HEADER}


# -- one default per option, or a reason ------------------------------------------------


@pytest.mark.parametrize("surface", sorted(SIGNATURES))
def test_each_signature_defaults_as_the_model_says(surface: str) -> None:
    for name, default in _keywords(SIGNATURES[surface]).items():
        assert _same(default, _option(name).default_on(surface)), name


def test_the_gateway_and_the_engine_default_as_the_model_says() -> None:
    for option in on("serve"):
        assert _same(getattr(GatewayConfig(), option.setting), option.default_on("serve"))
    for field in dataclasses.fields(Options):
        if field.name != "item_output_cap":
            assert _same(field.default, _option(field.name).default), field.name


def test_a_surface_that_defaults_otherwise_says_why() -> None:
    for option in OPTIONS:
        for surface, (default, why) in option.differs.items():
            assert surface in option.on.split(), (option.name, surface)
            assert not _same(default, option.default), option.name
            assert len(why.split()) >= 5, (option.name, surface)


def test_no_default_is_a_number_in_disguise() -> None:
    defaults = [*(d for f in SIGNATURES.values() for d in _keywords(f).values())]
    defaults += [f.default for f in dataclasses.fields(Options)]
    defaults += [o.default for o in OPTIONS] + [d for o in OPTIONS for d, _ in o.differs.values()]
    numbers = [d for d in defaults if isinstance(d, (int, float))]
    assert numbers
    assert {type(d) for d in numbers} <= {int, float, bool}


def test_not_given_is_one_visible_falsy_value() -> None:
    assert repr(coalesce.NOT_GIVEN) == "NOT_GIVEN"
    assert not coalesce.NOT_GIVEN
    assert isinstance(NOT_GIVEN, coalesce.NotGiven)
    assert copy.deepcopy(NOT_GIVEN) is NOT_GIVEN
    assert "max_items: 'int | NotGiven' = NOT_GIVEN" in str(inspect.signature(coalesce.prompt))


def _option(name: str) -> Option:
    return next(option for option in OPTIONS if option.name == name)


# -- the docs' tables ---------------------------------------------------------------


def _table(page: str, header: str) -> list[list[str]]:
    """The rows of the table in ``page`` whose header line starts with ``header``."""
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def _shown(value: Any) -> str | None:
    """How a docs table writes a simple default (``None`` for what it words instead)."""
    if isinstance(value, bool):
        return f"`{value}`"
    if isinstance(value, (int, float)):
        return f"{value:g}" if isinstance(value, float) else str(value)
    return value if isinstance(value, str) else None


@pytest.mark.parametrize(
    ("page", "surface", "complete"),
    [("prompt.md", "prompt", True), ("wrap.md", "wrap", False), ("batching.md", "batch", False)],
)
def test_each_options_table_names_only_the_models_options(
    page: str, surface: str, complete: bool
) -> None:
    named: set[str] = set()
    for cell, default, *_ in _table(page, "| option | default |"):
        names = re.findall(r"`(\w+)`", cell)
        named.update(names)
        shown = _shown(_option(names[0]).default_on(surface)) if len(names) == 1 else None
        assert shown is None or shown in default, (page, names, default)
    assert named <= _names(surface)
    assert {o.name for o in on(surface) if surface in o.differs} <= named  # the reason shown
    assert complete is False or named == _names(surface)


def test_the_gateway_table_names_each_flag_and_variable() -> None:
    rows = _table("gateway.md", "| flag | environment |")
    by_flag = {flag.strip("`"): (env, default) for flag, env, default, _ in rows}
    assert set(by_flag) == {o.flag for o in on("serve")}
    for option in on("serve"):
        env, default = by_flag[option.flag]
        assert env.startswith(f"`{option.variable}`"), option.flag
        shown = _shown(option.default_on("serve"))
        assert shown is None or shown in default, option.flag


def test_the_wrap_page_spells_every_keyword() -> None:
    text = (DOCS / "wrap.md").read_text(encoding="utf-8")
    section = text[
        text.index("\n## Options\n") : text.index("\n## ", text.index("\n## Options\n") + 1)
    ]
    assert set(_keywords(coalesce.wrap)) <= set(re.findall(r"\b(\w+)=", section))


# -- the API reference: every parameter described ----------------------------------------


_PUBLIC_FUNCTIONS = [
    getattr(coalesce, name)
    for name in coalesce.__all__
    if inspect.isfunction(getattr(coalesce, name))
]


@pytest.mark.parametrize(
    "function", [*_PUBLIC_FUNCTIONS, coalesce.Batcher], ids=lambda function: function.__name__
)
def test_every_parameter_is_described_in_its_docstring(function: Callable[..., Any]) -> None:
    doc = inspect.getdoc(function) or ""
    args = doc[doc.index("Args:") :]
    target = function.__init__ if isinstance(function, type) else function  # type: ignore[misc]
    for name, parameter in inspect.signature(target).parameters.items():
        stars = "**" if parameter.kind is parameter.VAR_KEYWORD else ""
        assert name == "self" or re.search(rf"^\s+{re.escape(stars + name)}:", args, re.M), name


# -- one error for a misspelt option, on every surface ----------------------------------


async def _batch(items: list[int]) -> list[int]:
    return items


@pytest.mark.parametrize(
    "make",
    [
        lambda: coalesce.wrap(SimulatedProvider().openai_client(), max_item=8),
        lambda: coalesce.prompt(client=SimulatedProvider().openai_client(), model="m", max_item=8),
        lambda: coalesce.batch(max_item=8),
        lambda: coalesce.Batcher(_batch, max_item=8),
    ],
    ids=["wrap", "prompt", "batch", "Batcher"],
)
def test_a_misspelt_option_names_the_closest_on_every_surface(make: Callable[[], Any]) -> None:
    with pytest.raises(coalesce.UnknownOptionError) as caught:
        make()
    assert str(caught.value).startswith("unknown option 'max_item': did you mean 'max_items'?")
    assert isinstance(caught.value, TypeError)
    assert isinstance(caught.value, coalesce.ConfigurationError)


def test_a_keyword_like_no_option_lists_the_options() -> None:
    with pytest.raises(coalesce.UnknownOptionError, match=r"coalesce\.Batcher takes fn, max_wait"):
        coalesce.Batcher(_batch, colour="red")
