"""Requests counted apart: the shadow guard's plain calls and the vote's second orders.

They check or settle answers; they are spent like any request, and save nothing, so
their listener tells the recorder their usage under their own kind, and nothing else
(no planning, no savings, no retry counts).
"""

from __future__ import annotations

from typing import Literal

from .._calls import NoObserver, RequestReport
from .._observe.recorder import PromptRecorder
from .counts import AccuracyCounts

__all__ = ["ApartListener"]


class ApartListener(NoObserver):
    """Counts one kind of checking request (``"shadow"`` or ``"vote"``) and its cost.

    Args:
        recorder: The function's recorder: its tokens and dollars are spent there.
        counts: Where the request and its dollars are counted.
        kind: Which kind of request it counts.
    """

    def __init__(
        self, recorder: PromptRecorder, counts: AccuracyCounts, kind: Literal["shadow", "vote"]
    ) -> None:
        self.recorder, self.counts, self.kind = recorder, counts, kind

    def request_done(self, report: RequestReport) -> None:
        """Count the request and what it spent."""
        completion = report.completion
        usage = None if completion is None else completion.usage
        tokens = 0 if usage is None else usage.input_tokens
        self.counts.spent(self.kind, self.recorder.savings.spend(usage), tokens)
