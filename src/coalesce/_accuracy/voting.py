"""``vote=True`` around a group runner: each packed group asked in two orders at once,
an item whose answers differ settled by a plain call (the decisions are
:mod:`coalesce._accuracy.vote`'s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from .._calls import Job, Runner
from .counts import AccuracyCounts
from .vote import MISSING, agreed, settled

__all__ = ["Voting"]


class Voting:
    """A :data:`~coalesce._calls.Runner` that votes where voting pays.

    Args:
        ask: The usual runner (the usual order).
        reverse: Asks a group in the reverse order, its requests counted apart; also
            the settling plain calls.
        plain: Asks each item of a group alone, as plain calls.
        packs: Whether a group of that many items is packed (else ``ask`` alone).
        pays: Whether two orders cost less than the group's plain calls.
        in_time: Whether a call's budget still leaves time to ask it alone.
        agree: The user's ``agree(a, b)``, or ``None`` for equality.
        counts: Told what was voted and settled.
    """

    def __init__(
        self,
        ask: Runner,
        reverse: Runner,
        plain: Runner,
        *,
        packs: Callable[[int], bool],
        pays: Callable[[list[Job]], bool],
        in_time: Callable[[Job], bool],
        agree: Callable[[Any, Any], bool] | None,
        counts: AccuracyCounts,
    ) -> None:
        self.ask, self.reverse, self.plain = ask, reverse, plain
        self.packs, self.pays, self.in_time = packs, pays, in_time
        self.agree, self.counts = agree, counts

    async def __call__(self, jobs: list[Job], resolve: Callable[[int, Any], None]) -> None:
        if not self.packs(len(jobs)):
            await self.ask(jobs, resolve)
        elif self.pays(jobs):
            await self._voted(jobs, resolve)
        else:  # two orders would cost more than plain calls
            await self.plain(jobs, resolve)

    async def _voted(self, jobs: list[Job], resolve: Callable[[int, Any], None]) -> None:
        """Ask the group in both orders at once; where the answers differ, ask the item
        alone if its budget leaves time."""
        twins = [Job(job.item, job.key, job.deadline, arrival=job.arrival) for job in jobs]
        self.counts.voted(len(jobs))
        first: dict[int, Any] = {}
        second: dict[int, Any] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(_run, self.ask, jobs, first.__setitem__)
            tg.start_soon(_run, self.reverse, twins, second.__setitem__)

        async def settle(index: int) -> None:
            one, other = first.get(index, MISSING), second.get(index, MISSING)
            alone: list[Any] = []
            job = jobs[index]
            if agreed(one, other, self.agree) is False:
                in_time = self.in_time(job)
                if in_time:  # else the usual order's answer, as without vote
                    lone = Job(job.item, job.key, job.deadline, arrival=job.arrival)
                    await self.reverse([lone], lambda _, o: alone.append(o))
                self.counts.vote_settled(in_time)
            resolve(index, settled(one, other, *alone[:1]))

        async with anyio.create_task_group() as tg:
            for index in range(len(jobs)):
                tg.start_soon(settle, index)


async def _run(runner: Runner, jobs: list[Job], resolve: Callable[[int, Any], None]) -> None:
    await runner(jobs, resolve)
