"""Every keyword of ``coalesce.prompt`` and ``coalesce.wrap`` is documented in its docs page's
options section, so a new option cannot land without its line in the docs."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import coalesce

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _options_section(page: str) -> str:
    text = (DOCS / page).read_text(encoding="utf-8")
    start = text.index("\n## Options\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _keywords(function: Callable[..., Any]) -> list[str]:
    return [
        p.name for p in inspect.signature(function).parameters.values() if p.kind is p.KEYWORD_ONLY
    ]


@pytest.mark.parametrize(
    ("function", "page"), [(coalesce.prompt, "prompt.md"), (coalesce.wrap, "wrap.md")]
)
def test_every_keyword_is_in_the_options_section(function: Callable[..., Any], page: str) -> None:
    section = _options_section(page)
    named = set(re.findall(r"`(\w+)`", section)) | set(re.findall(r"\b(\w+)=", section))
    keywords = _keywords(function)
    assert len(keywords) > 10  # the signature was read, not an empty one
    assert [name for name in keywords if name not in named] == []
