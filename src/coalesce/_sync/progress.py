"""Progress of a long :meth:`~coalesce.PromptFunction.map`: a bar on a terminal.

``progress=True`` draws a bar on standard error when it is a terminal (rich's, if rich
is installed, as the ``progress`` extra does, else a plain line rewritten in place) and nothing otherwise, so that
logs and CI output stay clean; ``progress="always"`` draws it anyway (a plain line per
tenth done where standard error is not a terminal).
"""

from __future__ import annotations

import sys
from typing import Any, Literal, Protocol, TextIO

__all__ = ["Display", "ProgressOption", "check_progress", "display"]

#: What ``progress=`` takes.
ProgressOption = bool | Literal["always"]


class Display(Protocol):
    """Where progress is shown."""

    def update(self, done: int, total: int) -> None:
        """``done`` of ``total`` calls have finished."""

    def close(self) -> None:
        """The map has ended (finished, failed or been cancelled)."""


class _Rich:
    """rich's progress bar, with the count, the rate and the time left."""

    def __init__(self, label: str, total: int, stream: TextIO) -> None:
        import rich.console
        import rich.progress

        console = rich.console.Console(file=stream)
        self._bar: Any = rich.progress.Progress(
            *rich.progress.Progress.get_default_columns(),
            rich.progress.MofNCompleteColumn(),
            console=console,
            transient=False,
        )
        self._task = self._bar.add_task(label, total=total)
        self._bar.start()

    def update(self, done: int, total: int) -> None:
        self._bar.update(self._task, completed=done, total=total)

    def close(self) -> None:
        self._bar.stop()


class _Plain:
    """One line: rewritten in place on a terminal, else a new line per tenth done."""

    def __init__(self, label: str, stream: TextIO, *, terminal: bool) -> None:
        self._label = label
        self._stream = stream
        self._terminal = terminal
        self._shown = -1 if terminal else 0  # the step shown last (a log starts at 10%)

    def update(self, done: int, total: int) -> None:
        step = done * (100 if self._terminal else 10) // max(total, 1)
        if step == self._shown:
            return
        self._shown = step
        line = f"{self._label}: {done}/{total} ({done * 100 // max(total, 1)}%)"
        self._stream.write(f"\r{line}" if self._terminal else f"{line}\n")
        self._stream.flush()

    def close(self) -> None:
        if self._terminal and self._shown > -1:
            self._stream.write("\n")
            self._stream.flush()


def check_progress(progress: object) -> ProgressOption:
    """``progress=`` checked: ``True``, ``False`` or ``"always"``.

    Raises:
        ValueError: Anything else.
    """
    if progress is True or progress is False or progress == "always":
        return progress
    raise ValueError(f"progress must be True, False or 'always', got {progress!r}")


def display(
    progress: ProgressOption, label: str, total: int, stream: TextIO | None = None
) -> Display | None:
    """The display ``progress=`` asks for (``True``: a bar on a terminal only,
    ``"always"``, ``False``), counting ``total`` calls of ``label`` on ``stream``
    (default: standard error); ``None`` for none."""
    if progress is False:
        return None
    stream = sys.stderr if stream is None else stream
    terminal = stream.isatty()
    if not terminal and progress != "always":
        return None
    if terminal:
        try:
            return _Rich(label, total, stream)
        except ImportError:
            pass
    return _Plain(label, stream, terminal=terminal)
