"""The progress display of ``map``: a bar on a terminal, plain lines when forced."""

from __future__ import annotations

import io

import pytest

from coalesce._sync.progress import check_progress, display


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_nothing_is_drawn_unless_asked() -> None:
    assert display(False, "tag", 10, Terminal()) is None


def test_true_draws_nothing_where_standard_error_is_not_a_terminal() -> None:
    assert display(True, "tag", 10, io.StringIO()) is None


def test_always_draws_a_line_per_tenth_where_it_is_not_a_terminal() -> None:
    stream = io.StringIO()
    shown = display("always", "tag", 20, stream)
    assert shown is not None
    for done in range(1, 21):
        shown.update(done, 20)
    shown.close()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "tag: 2/20 (10%)"
    assert lines[-1] == "tag: 20/20 (100%)"
    assert len(lines) == 10


def test_a_terminal_gets_riches_bar() -> None:
    stream = Terminal()
    shown = display(True, "tag", 4, stream)
    assert type(shown).__name__ == "_Rich"
    assert shown is not None
    for done in range(1, 5):
        shown.update(done, 4)
    shown.close()
    assert "tag" in stream.getvalue()
    assert "4/4" in stream.getvalue()


def test_without_rich_a_terminal_gets_a_line_rewritten_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "rich.progress", None)
    stream = Terminal()
    shown = display(True, "tag", 2, stream)
    assert shown is not None
    shown.update(1, 2)
    shown.update(2, 2)
    shown.close()
    assert stream.getvalue() == "\rtag: 1/2 (50%)\rtag: 2/2 (100%)\n"


@pytest.mark.parametrize("value", [True, False, "always"])
def test_progress_takes_true_false_or_always(value: object) -> None:
    assert check_progress(value) == value


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_progress_refuses_anything_else(value: object) -> None:
    with pytest.raises(ValueError, match="progress must be"):
        check_progress(value)
