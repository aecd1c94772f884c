"""The SDKs' internals coalesce uses: each still where ``providers/_sdk_openai.py`` and
``providers/_sdk_anthropic.py`` say it is (a release that moves one fails here, by
name), no other module of coalesce reaching into an SDK, and the supported ranges
those modules state being the ones ``pyproject.toml`` declares."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anthropic
import httpx2
import openai
import pytest

import coalesce
from coalesce.providers import _sdk_anthropic, _sdk_openai

SRC = Path(coalesce.__file__).parent
ROOT = SRC.parent.parent
SDKS: dict[str, tuple[ModuleType, ModuleType]] = {
    "openai": (openai, _sdk_openai),
    "anthropic": (anthropic, _sdk_anthropic),
}
#: The modules allowed to name an SDK's internals.
HOMES = {"providers/_sdk_openai.py", "providers/_sdk_anthropic.py"}


def _internals() -> Iterator[Any]:
    for sdk, (_, home) in SDKS.items():
        for name, where in home.INTERNALS.items():
            yield pytest.param(sdk, name, where, id=f"{where}.{name}")


@pytest.mark.parametrize(("sdk", "name", "where"), list(_internals()))
def test_every_internal_is_where_the_table_says(sdk: str, name: str, where: str) -> None:
    module, home = SDKS[sdk]
    try:
        found = getattr(importlib.import_module(where), name)
    except (ImportError, AttributeError):
        pytest.fail(f"{sdk} {module.__version__} moved {where}.{name} (providers/_sdk_{sdk}.py)")
    assert getattr(home, name) is found


@pytest.mark.parametrize("sdk", SDKS)
def test_a_moved_internal_raises_an_import_error_naming_it_and_the_range(
    sdk: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module, home = SDKS[sdk]
    monkeypatch.setitem(home.INTERNALS, "FinalRequestOptions", f"{sdk}._gone")
    with pytest.raises(ImportError) as caught:
        exec(f"from coalesce.providers._sdk_{sdk} import FinalRequestOptions", {})
    assert str(caught.value) == (
        f"{sdk} {module.__version__} has no {sdk}._gone.FinalRequestOptions, which coalesce"
        f" uses: coalesce supports {sdk}{home.SUPPORTED} and is tested on"
        f" {', '.join(home.TESTED)} and the newest (docs/wrap.md, Supported versions)"
    )
    with pytest.raises(AttributeError):
        home.not_an_internal  # noqa: B018


def _objects(sdk: str) -> dict[str, Any]:
    """An instance of each class whose private attributes coalesce reads."""
    module, _ = SDKS[sdk]
    client_class = "AsyncOpenAI" if sdk == "openai" else "AsyncAnthropic"
    client = getattr(module, client_class)(api_key="sk-test", base_url="http://sdk.test")
    response = httpx2.Response(200, content=b"", request=httpx2.Request("POST", "http://sdk.test"))
    stream = module.AsyncStream(cast_to=object, response=response, client=client, options=None)
    return {client_class: client, "AsyncStream": stream}


@pytest.mark.parametrize("sdk", SDKS)
def test_every_private_attribute_coalesce_reads_is_set_by_the_sdk(sdk: str) -> None:
    module, home = SDKS[sdk]
    objects = _objects(sdk)
    missing = [
        f"{sdk}.{kind}.{attribute}"
        for kind, attributes in home.ATTRIBUTES.items()
        for attribute in attributes
        if attribute not in vars(objects[kind])
    ]
    assert missing == [], f"{sdk} {module.__version__} no longer sets these"


# What the scan below flags: an import of an SDK's private module or of its ``lib``
# (``from openai.lib._parsing import x``, ``import anthropic._models``), such an
# attribute (``openai._models``), and a module name built at run time that points at one
# (``import_module(f"{sdk}._models")``).
_SDK_INTERNAL = re.compile(r"^(openai|anthropic)\.(_|lib\b)")
_BUILT = re.compile(r"\}\._|\}\.lib\b|^(openai|anthropic)\.(_|lib\b)")


def reaches(tree: ast.Module) -> list[str]:
    """Every place in ``tree`` that names an SDK's internals, as ``line: code``."""
    found: dict[int, str] = {}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Attribute):
            names = [ast.unparse(node)]
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("import_module")
            and node.args
            and _BUILT.search(_text(node.args[0]))
        ):
            found.setdefault(node.lineno, ast.unparse(node))
        if any(_SDK_INTERNAL.match(name) for name in names):
            found.setdefault(node.lineno, ast.unparse(node))
    return [f"{line}: {code}" for line, code in sorted(found.items())]


def _text(node: ast.expr) -> str:
    """A module name as written: a string, or an f-string's parts around ``{...}``."""
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


def test_no_other_module_reaches_into_an_sdk() -> None:
    found = [
        f"{path.relative_to(SRC)}:{where}"
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).as_posix() not in HOMES
        for where in reaches(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert found == []


def test_the_scan_finds_each_way_of_reaching_in() -> None:
    source = """
from openai.lib._parsing import parse_chat_completion
from anthropic import _models
import anthropic._constants
x = openai._legacy_response.LegacyAPIResponse
y = importlib.import_module(f"{sdk}._response")
z = importlib.import_module("openai.lib._parsing")
from openai.types.chat import ChatCompletion
from ..providers._sdk_openai import parse_response
w = openai.AsyncStream[events]
v = importlib.import_module(sdk)
"""
    assert [line.split(":")[0] for line in reaches(ast.parse(source))] == [
        "2",
        "3",
        "4",
        "5",
        "6",
        "7",
    ]


def _release(version: str) -> tuple[int, ...]:
    parts = [int(part) for part in version.split(".")]
    return (*parts, *[0] * (3 - len(parts)))


@pytest.mark.parametrize("sdk", SDKS)
def test_the_supported_range_is_the_extras_and_ci_runs_its_oldest_release(sdk: str) -> None:
    _, home = SDKS[sdk]
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'{sdk} = ["{sdk}{home.SUPPORTED}", ' in pyproject  # then httpx2, which it is built on
    low, high = re.fullmatch(r">=([\d.]+),<(\d+)", home.SUPPORTED).groups()  # type: ignore[union-attr]
    assert _release(home.TESTED[0]) == _release(low)
    assert all(_release(low) <= _release(v) < _release(high) for v in home.TESTED)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert [v for v in home.TESTED if f"{sdk}=={v}" not in ci] == []
