"""What serves one LLM function's calls, assembled from its spec and options.

:func:`assemble` builds the parts once, for :class:`~coalesce._engine.engine.Engine`:
the token footprint, the budget planner, the context-window admission, the packing
cost, the schema trust, the statistics and dispatch listeners, and the runner that asks
for a group: :func:`~coalesce._engine.group.run_group`, wrapped by ``vote=True``'s
:class:`~coalesce._accuracy.voting.Voting` and the shadow guard's
:class:`~coalesce._accuracy.shadowing.Shadowing` when the function asks for them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from .._accuracy.apart import ApartListener
from .._accuracy.counts import AccuracyCounts
from .._accuracy.learning import LearningBudget
from .._accuracy.memory import CapMemory
from .._accuracy.shadow import ShadowGuard
from .._accuracy.shadowing import LearningCosts, Positions, Shadowing
from .._accuracy.texts import agreement_for
from .._accuracy.trust import SchemaTrust, declared_enforcement
from .._accuracy.vote import VoteCosts
from .._accuracy.voting import Voting
from .._calls import GroupObserver, Job, Observers, Runner
from .._exceptions import CoalesceWarning
from .._observe.dispatch import DispatchListener, request_predictor
from .._observe.listeners import StatisticsListener
from .._observe.plain import PlainCounts, PlainListener
from .._observe.recorder import PromptRecorder
from .._options import (
    BUDGET_WAIT_SHARE,
    IN_MEMORY,
    LEARNED_CAP_CEILING,
    NOT_GIVEN,
    PROMPT_MAX_ITEMS,
    wait_for_company,
)
from .._paths import default_store_path
from .._planning.context import known_output_limit
from .._planning.cost import PackingCost, voting_pays
from .._planning.footprint import Footprint, footprint
from .._planning.longest import bounded_output_tokens
from .._planning.output import expected_output_tokens
from .._planning.planner import PlanLimits
from .._planning.policy import BudgetPolicy
from .._planning.state import Planning
from .._planning.tokens import TokenEstimator, estimator_for
from .._pricing import PromptCache, price_of
from .._validate import warn_caller
from .._wire.screen import Screen, checked_screen, screen_of
from .admission import Admission, ContextPolicy, admission_for
from .group import Group, packs, run_group, run_plain
from .spec import FunctionSpec, Options, keyed_replies

__all__ = [
    "PackingCosts",
    "Parts",
    "assemble",
    "cache_key",
    "cap_memory",
    "declared_cache",
    "learns",
]


@dataclass
class Parts:
    """Everything that serves one function's calls (see the module doc)."""

    estimator: TokenEstimator
    footprint: Footprint
    recorder: PromptRecorder
    trust: SchemaTrust
    planning: Planning
    admission: Admission
    cost: PackingCost
    shadow: ShadowGuard | None
    runner: Runner
    policy: ContextPolicy
    statistics: StatisticsListener
    dispatch: DispatchListener
    max_items: int  # the most items a request may ever carry (the cap's limit)
    screen: Screen | None = None  # whether a call must go alone (``screen=``)

    def in_time(self, job: Job, left: float) -> bool:
        """Whether real time may still answer ``job`` with ``left`` seconds (as the
        planner predicts a request of it alone)."""
        planning = self.planning
        if left <= 0 or not math.isfinite(left):
            return left > 0
        plan = planning.plan_item(job.item, job.partition, job.deadline, anyio.current_time())
        return request_predictor(planning)([plan]) <= left


class PackingCosts:
    """The statistics part of packing's cost decisions: ``smallest_paying_group``, the
    smallest group any engine recording here packs (``None`` when none can pay).

    ``wrap``'s kinds of call share their model's recorder, each with its own decision.
    """

    def __init__(self) -> None:
        self.costs: list[PackingCost] = []

    def statistics(self) -> Mapping[str, Any]:
        """The field, from the engines' current decisions."""
        paying = [cost.smallest for cost in self.costs if cost.smallest is not None]
        return {"smallest_paying_group": min(paying, default=None)}


def assemble(
    spec: FunctionSpec,
    options: Options,
    recorder: PromptRecorder,
    observers: Sequence[GroupObserver] = (),
    lane: str = "realtime",
) -> Parts:
    """The parts of one function, its requests counted by ``recorder`` at ``lane``'s
    price and told to ``observers`` too.

    When the group cap is learned (:func:`learns`), every part sizes groups up to the
    learning's ceiling, :data:`~coalesce._options.LEARNED_CAP_CEILING`; the shadow
    guard's cap, in the dispatch policy, keeps them to what was learned.
    """
    learn = learns(options)
    if learn:
        options = options.replace(max_items=LEARNED_CAP_CEILING)
    estimator = options.token_estimator or estimator_for(spec.model)
    shape = {"structured": spec.provider.structured, "keyed": keyed_replies(spec, options)}
    pinned = footprint(spec.instructions, spec.output_schema, estimator, **shape)
    unpinned = footprint(spec.instructions, spec.output_schema, estimator, pin=False, **shape)
    trust = SchemaTrust(declared_enforcement(spec.provider, options.schema_enforced))
    cost = _packing_cost(spec, options, pinned)
    shadow = _shadow_guard(spec, options, learn, cost.smallest)
    paying = _paying(cost, shadow)
    planning = _planning(spec, options, pinned, estimator, trust.enforced, paying)
    answer = expected_output_tokens(spec.output_schema, estimator, options.expected_output_tokens)
    admission = admission_for(spec, options, pinned, estimator, answer)
    vote_costs = VoteCosts(answer, pinned, estimator.count)

    def learn_cache(cached_tokens: int) -> int:
        if cost.saw_cached(cached_tokens) and shadow is not None and cost.smallest is not None:
            shadow.at_least(cost.smallest)  # a cache makes packing pay from larger groups
        return cost.plain_cached_tokens()

    dispatch = DispatchListener(recorder, planning)
    statistics = StatisticsListener(recorder, pinned, learn_cache, unpinned, lane, dispatch)
    positions = Positions()
    plain = PlainListener(recorder.part(PlainCounts, PlainCounts), dispatch, paying)
    listeners: list[GroupObserver] = [statistics, plain, trust, admission.window, planning]
    listeners += [vote_costs] if options.vote else []
    listeners += [positions] if shadow is not None else []
    group = Group(
        spec, options, Observers(*listeners, *observers), planning, trust, cost, cache_key(spec),
        output_cap=admission.request_cap,
    )  # fmt: skip
    cap = None if shadow is None else _cap(shadow, planning)
    policy = ContextPolicy(admission, BudgetPolicy(planning), cap)
    parts = Parts(
        estimator, pinned, recorder, trust, planning, admission, cost, shadow,
        partial(run_group, group), policy, statistics, dispatch, options.most_items,
    )  # fmt: skip
    costs = LearningCosts(cost, estimator.count, lambda: answer)
    parts.runner = _runner(parts, group, options, vote_costs, positions, costs)
    parts.screen = checked_screen(spec.name, screen_of(options.screen))
    recorder.part(PackingCosts, PackingCosts).costs.append(cost)
    return parts


def learns(options: Options) -> bool:
    """Whether the function's group cap is learned: ``shadow=`` is on and ``max_items``
    was not given (an explicit ``max_items`` pins it). Free text too: its answers are
    compared by their words (:func:`~coalesce._accuracy.texts.agreement_for`)."""
    return options.shadow_rate > 0 and options.max_items is NOT_GIVEN


def _cap(shadow: ShadowGuard, planning: Planning) -> Callable[[Sequence[Job]], int]:
    """The group cap of a window: the guard's, or its cold burst's for a window of
    calls all made before the probe's reply (:meth:`ShadowGuard.burst_cap`)."""

    def cap(members: Sequence[Job]) -> int:
        warmed = planning.warmed
        if warmed is not None and all(job.arrival < warmed for job in members):
            return shadow.burst_cap()
        return shadow.cap

    return cap


def _paying(cost: PackingCost, shadow: ShadowGuard | None) -> Callable[[], float]:
    """The smallest group that pays for its packing now: ``math.inf`` when none does,
    or when the group cap keeps every group below it."""

    def paying() -> float:
        least = cost.pays_from
        return math.inf if shadow is not None and shadow.cap < least else least

    return paying


def _runner(
    parts: Parts,
    group: Group,
    options: Options,
    vote_costs: VoteCosts,
    positions: Positions,
    costs: LearningCosts,
) -> Runner:
    """The group runner, with the vote and the shadow guard around it if asked for."""
    recorder = parts.recorder
    priced = parts.cost.price is not None
    counts = recorder.part(
        AccuracyCounts, lambda: AccuracyCounts(options.most_items, priced=priced)
    )
    runner: Runner = partial(run_group, group)
    if options.vote:
        # The second orders and the settling plain calls: counted apart, they save nothing.
        vote = ApartListener(recorder, counts, "vote")
        reverse = _apart(group, Observers(vote, vote_costs), True)
        runner = Voting(
            runner,
            partial(run_group, reverse),
            partial(run_plain, group),
            packs=partial(packs, group),
            pays=_voting_pays(parts, vote_costs, counts),
            in_time=lambda job: parts.in_time(job, job.deadline - anyio.current_time()),
            agree=agreement_for(group.spec.output_schema, options.agree),
            counts=counts,
        )
    if parts.shadow is not None:
        counts.watch(parts.shadow)
        alone = _apart(group, ApartListener(recorder, counts, "shadow"))
        runner = Shadowing(
            runner, partial(run_group, alone), parts.shadow, recorder, positions, costs
        )
    return runner


def _apart(group: Group, observer: GroupObserver, reverse: bool = False) -> Group:
    """The function's group, its requests counted by ``observer`` alone: they plan
    nothing and save nothing."""
    return dataclasses.replace(group, observer=observer, planning=None, cost=None, reverse=reverse)


def _voting_pays(
    parts: Parts, learned: VoteCosts, counts: AccuracyCounts
) -> Callable[[list[Job]], bool]:
    """Whether asking a group in two orders costs less than its plain calls."""

    def pays(jobs: list[Job]) -> bool:
        cost, expected = parts.cost, learned.answer_tokens()
        return voting_pays(
            cost.footprint,
            cost.price,
            cost.cache,
            item_tokens=sum(parts.estimator.count(job.key) for job in jobs),
            output_tokens=len(jobs) * expected,
            items=len(jobs),
            disagreement=counts.vote_disagreement(),
            overheads=learned.overheads(),
        )

    return pays


def _packing_cost(spec: FunctionSpec, options: Options, pinned: Footprint) -> PackingCost:
    """Whether packing pays for the function (at the model's price, from ``prices=``);
    warns once if it never does."""
    cost = PackingCost(
        pinned,
        price_of(spec.model, options.prices),
        options.most_items,
        declared_cache(spec),
        auto=options.packing == "auto",
    )
    if cost.smallest is None and options.most_items > 1:  # 1: packing is off anyway
        _warn_packing_cannot_pay(spec, pinned, options.most_items)
    return cost


def _shadow_guard(
    spec: FunctionSpec, options: Options, learn: bool, pays_from: int | None
) -> ShadowGuard | None:
    """The function's shadow guard, if it asked for one (``shadow=``) and packs.

    A learned cap starts where the function's memory says, else at the safe cap
    (:data:`~coalesce._options.PROMPT_MAX_ITEMS`), or at the smallest group packing
    pays for if that is larger (smaller groups go as plain calls, and teach nothing).
    """
    # The default long-run rate applies only where the cap is learned; a given one, everywhere.
    rate = options.shadow_rate if learn or options.shadow is not NOT_GIVEN else 0.0
    if rate <= 0 or options.most_items < 2:
        return None
    memory = start = None
    if learn:
        memory = cap_memory(spec, options.store)
        start = max(PROMPT_MAX_ITEMS, pays_from or 0)
    return ShadowGuard(
        rate,
        options.min_agreement,
        options.most_items,
        agreement_for(spec.output_schema, options.agree),
        learn=learn,
        start=start,
        memory=memory,
        name=spec.name,
        budget=LearningBudget() if learn else None,
        rate_budgeted=options.shadow is NOT_GIVEN,
    )


def cap_memory(spec: FunctionSpec, store: Any) -> CapMemory | None:
    """Where the function's learned cap is kept: ``caps/`` beside the job store
    (``store=``: a path or a job store; ``None``: ``$COALESCE_STORE``, else the user data
    directory), or nowhere on disk when the store is ``":memory:"``."""
    path = getattr(store, "path", store) or default_store_path()
    if str(path) == IN_MEMORY:
        return None
    return CapMemory.for_key(cache_key(spec), spec.model, Path(path).expanduser().parent / "caps")


def declared_cache(spec: FunctionSpec) -> PromptCache | None:
    """The prompt cache the provider declares for the function's model, if any."""
    declare = getattr(spec.provider, "prompt_cache", None)
    cache = declare(spec.model) if callable(declare) else None
    return cache if isinstance(cache, PromptCache) else None


def cache_key(spec: FunctionSpec) -> str:
    """A stable name for the function's shared prefix: its model, instructions and
    output schema (the same function in every process shares one cache entry)."""
    schema = json.dumps(spec.output_schema, sort_keys=True, default=str)
    digest = hashlib.sha256(f"{spec.model}\0{spec.instructions}\0{schema}".encode())
    return f"coalesce-{digest.hexdigest()[:16]}"


def _warn_packing_cannot_pay(spec: FunctionSpec, footprint: Footprint, max_items: int) -> None:
    warn_caller(
        f"{spec.name}: packing cannot pay for this function: each plain call pays"
        f" ~{footprint.plain_shared} shared tokens (instructions and output schema), while"
        f" each packed item adds ~{footprint.item_frame} in and ~{footprint.answer_frame} out and"
        f" a packed request ~{footprint.shared} shared; no group of up to {max_items} costs"
        " less than plain calls. Its calls are sent at once, as plain calls. Longer"
        " shared instructions (or a larger max_items) make packing pay.",
        CoalesceWarning,
    )


def _output_limit(model: str, configured: int | None) -> int | None:
    """The most output tokens a planned request may expect: the function's cap, within
    the model's known output limit."""
    known = known_output_limit(model)
    limits = [limit for limit in (configured, known) if limit is not None]
    return min(limits, default=None)


def _planning(
    spec: FunctionSpec,
    options: Options,
    pinned: Footprint,
    estimator: TokenEstimator,
    early_answers: bool,
    paying: Callable[[], float],
) -> Planning:
    """The function's budget planner. Every function has one, budget or not: each call's
    own budget sizes its wait and its group, however it was given (a call without one
    waits ``max_wait``, the default short window, unplanned).

    ``max_wait`` left at its default, a call with a budget waits for company up to a
    quarter of it (:data:`~coalesce._options.BUDGET_WAIT_SHARE`), and never less than
    the default window; a ``max_wait`` given is every call's wait.

    ``early_answers``: streamed answers are handed over as each completes (the provider
    is trusted to enforce the schema); otherwise every caller waits for the whole reply.
    ``paying``: the smallest group packing pays for now; with none, calls go at once and
    a cold start holds nothing, and a cold start probes unless the prior admits a group
    that large.
    """
    limits = PlanLimits(
        max_items=options.most_items,
        max_wait=wait_for_company(options.max_wait, None),  # with no budget
        budget_share=BUDGET_WAIT_SHARE if options.max_wait is NOT_GIVEN else None,
        shared_tokens=pinned.shared,
        max_output_tokens=_output_limit(spec.model, options.max_output_tokens),
        per_item_overhead_tokens=pinned.item_frame,
        per_item_output_overhead_tokens=pinned.answer_frame,
        streaming=options.stream and early_answers,
    )
    declared = options.expected_output_tokens
    prior = expected_output_tokens(spec.output_schema, estimator, declared)
    # Free text's size is a guess until a reply: the first replies replace it.
    guessed = not declared and bounded_output_tokens(spec.output_schema, estimator) is None
    return Planning(
        limits,
        prior,
        options.latency_prior,
        estimator,
        guessed_output=guessed,
        cold_start=math.isfinite(paying()),
        paying=paying,
    )
