"""``vote=True`` (issue 15, point 2): each packed group is asked in two orders, and a
plain call settles the items whose two answers differ."""

from __future__ import annotations

import json
import math
from typing import Any, Literal

import anyio
import pytest

import coalesce
from coalesce._accuracy.vote import MISSING, VoteCosts, agreed, disagreement, settled
from coalesce._calls import Job, RequestReport
from coalesce._planning.cost import voting_pays
from coalesce._planning.footprint import footprint
from coalesce.providers import Completion, CompletionRequest, Usage
from coalesce.testing import PackingDegradation, SimulatedProvider, expected_output

Label = Literal["even", "odd", "unknown"]
RULES = " ".join(f"Rule {n}: read the whole number before answering." for n in range(30))


# -- the pure decisions -----------------------------------------------------------------


def test_two_equal_answers_agree_and_two_different_ones_do_not() -> None:
    assert agreed("even", "even", None) is True
    assert agreed("even", "odd", None) is False
    assert agreed(1.0, 1.04, lambda a, b: abs(a - b) < 0.1) is True


def test_an_error_on_either_side_leaves_nothing_to_settle() -> None:
    error = coalesce.ItemError("no answer", item_id="1")
    assert agreed(error, "odd", None) is None
    assert agreed("odd", MISSING, None) is None


def test_disagreement_is_the_low_end_of_its_interval() -> None:
    # One unlucky group does not stop the voting; a rate seen many times does.
    assert disagreement(0, 0) == 0.0
    assert disagreement(4, 8) < 0.25
    assert 0.4 < disagreement(300, 600) < 0.5
    assert disagreement(4, 8) < disagreement(40, 80) < disagreement(400, 800) < 0.5


def test_the_plain_answer_wins_then_the_usual_order_then_the_reverse_one() -> None:
    error = coalesce.ItemError("no answer", item_id="1")
    assert settled("odd", "even", "even") == "even"
    assert settled("odd", "odd") == "odd"
    assert settled(error, "even") == "even"
    assert settled("odd", error, error) == "odd"
    assert settled(error, error) is error


LABEL_SCHEMA = {"enum": ["even", "odd", "unknown"], "type": "string"}
GPT_4O_MINI = coalesce.price_for("gpt-4o-mini")


def costs(instructions: str) -> Any:
    estimator = coalesce.TiktokenEstimator()
    return footprint(instructions, LABEL_SCHEMA, estimator, structured=True, keyed=True)


def test_voting_pays_where_two_packed_requests_cost_less_than_plain_calls() -> None:
    long, short = costs(f"Parity. {RULES}"), costs("Parity.")
    answers = {"output_tokens": 8, "items": 8}
    assert voting_pays(long, GPT_4O_MINI, None, item_tokens=40, **answers)
    # One-line instructions: packing saves too little to pay for a second request...
    assert not voting_pays(short, GPT_4O_MINI, None, item_tokens=40, **answers)
    # ...and long items are paid twice.
    assert not voting_pays(long, GPT_4O_MINI, None, item_tokens=8 * 400, **answers)
    # Items the orders disagree on are asked alone too: frequent disagreement costs.
    assert not voting_pays(long, GPT_4O_MINI, None, item_tokens=40, disagreement=0.9, **answers)


# -- through @coalesce.prompt -------------------------------------------------------------


class PositionBiased:
    """A model that answers every item right, except the last item of a packed request,
    answered wrongly (small models answer late items worse)."""

    def __init__(self) -> None:
        self.packed: list[list[str]] = []  # the inputs of each packed request, in order
        self.plain: list[str] = []

    @staticmethod
    def right(n: str) -> str:
        return "even" if int(n) % 2 == 0 else "odd"

    @staticmethod
    def wrong(n: str) -> str:
        return "odd" if int(n) % 2 == 0 else "even"

    async def __call__(self, request: CompletionRequest) -> str:
        try:
            items = json.loads(request.user)
        except ValueError:
            items = None
        if not isinstance(items, list):  # a plain call of one item
            self.plain.append(request.user)
            return json.dumps({"answer": self.right(request.user)})
        inputs = [str(item["input"]) for item in items]
        self.packed.append(inputs)
        answers = {str(item["id"]): self.right(str(item["input"])) for item in items}
        answers[str(items[-1]["id"])] = self.wrong(inputs[-1])
        return json.dumps({"results": answers})


def parity(client: Any, rules: int = 1, **options: Any) -> Any:
    async def classify(number: str) -> Label:
        """Is the number even or odd?"""

    options.setdefault("max_wait", 1.0)
    instructions = f"Parity. {' '.join([RULES] * rules)}"
    return coalesce.prompt(
        client=client, model="gpt-4o-mini", instructions=instructions, **options
    )(classify)


async def ask_all(fn: Any, items: list[str]) -> dict[str, Any]:
    answers: dict[str, Any] = {}

    async def one(item: str) -> None:
        answers[item] = await fn(item)

    async with anyio.create_task_group() as tg:
        for item in items:
            tg.start_soon(one, item)
    return answers


@pytest.mark.anyio
async def test_the_second_request_writes_the_group_in_reverse() -> None:
    model = PositionBiased()
    fn = parity(model, max_items=4, packing="always", vote=True)
    numbers = ["10", "21", "32", "43"]  # one group of four
    answers = await ask_all(fn, numbers)
    first, second = model.packed
    assert second == first[::-1]
    # The last item of each order was answered wrongly: the two orders disagree on
    # those two items, and a plain call settles each.
    assert answers == {n: PositionBiased.right(n) for n in numbers}
    wrong_somewhere = {first[-1], second[-1]}
    assert set(model.plain) == wrong_somewhere
    stats = fn.statistics()
    assert stats.votes_settled == 2
    assert stats.vote_requests == 1 + 2  # the second order, two plain calls
    assert stats.requests == 1  # the usual order (counted as the function's requests)


@pytest.mark.anyio
async def test_without_vote_the_late_items_wrong_answer_is_delivered() -> None:
    model = PositionBiased()
    fn = parity(model, max_items=4, packing="always")
    numbers = ["10", "21", "32", "43"]
    answers = await ask_all(fn, numbers)
    (inputs,) = model.packed
    assert answers[inputs[-1]] == PositionBiased.wrong(inputs[-1])
    assert fn.statistics().vote_requests == 0


@pytest.mark.anyio
async def test_a_group_voting_would_make_dearer_than_plain_calls_is_asked_plain() -> None:
    model = PositionBiased()
    fn = coalesce.prompt(
        client=model, model="gpt-4o-mini", max_wait=1.0, packing="always", vote=True
    )(parity_of)  # a one-line instruction: two packed requests cost more than four plain
    numbers = ["10", "21", "32", "43"]
    answers = await ask_all(fn, numbers)
    assert answers == {n: PositionBiased.right(n) for n in numbers}
    assert model.packed == []
    assert sorted(model.plain) == numbers
    stats = fn.statistics()
    assert (stats.requests, stats.vote_requests) == (4, 0)


@pytest.mark.anyio
async def test_voting_stops_where_disagreements_make_it_dearer_than_plain_calls() -> None:
    # Half of each group of four disagrees (the last item of each order). Once that
    # rate is confidently seen, two packed requests and two plain calls per group
    # cost more than four plain calls: later groups go plain, and stay plain.
    model = PositionBiased()
    fn = parity(model, max_items=4, packing="always", vote=True)
    numbers = [str(n) for n in range(10, 10 + 4 * 12)]
    for start in range(0, len(numbers), 4):
        group = numbers[start : start + 4]
        assert await ask_all(fn, group) == {n: PositionBiased.right(n) for n in group}
    voted = len(model.packed) // 2  # the first groups, in two orders
    assert 1 <= voted < 12
    assert set(model.packed[-1]) == set(numbers[4 * voted - 4 : 4 * voted])  # came first
    assert len(model.plain) == 2 * voted + 4 * (12 - voted)  # settling, then plain
    assert fn.statistics().votes_settled == 2 * voted


@pytest.mark.anyio
async def parity_of(number: str) -> Label:
    """Is the number even or odd?"""


@pytest.mark.anyio
async def test_a_call_alone_is_not_voted_on() -> None:
    model = PositionBiased()
    fn = parity(model, max_items=4, packing="always", vote=True)
    assert await fn("7") == "odd"
    assert model.packed == []
    assert model.plain == ["7"]
    assert fn.statistics().vote_requests == 0


@pytest.mark.anyio
async def test_voting_on_the_simulator_keeps_only_answers_wrong_in_both_orders() -> None:
    # Every position down a packed request adds 4% of wrong answers. Degraded answers
    # are the same wrong answer in both orders, so an item is delivered wrong only when
    # both of its orders degraded it; where one did, the plain call answered it right.
    degradation = PackingDegradation(per_position=0.04, free_items=1)
    items = [f"ticket {n}" for n in range(160)]
    outcomes: dict[bool, tuple[dict[str, Any], Any, SimulatedProvider]] = {}
    for vote in (False, True):
        sim = SimulatedProvider(degradation=degradation)
        # Instructions long enough for voting to pay at the disagreements seen here.
        fn = parity(
            sim.openai_client(), rules=4, max_items=8, packing="always", vote=vote, shadow=0
        )
        answers: dict[str, Any] = {}
        for start in range(0, len(items), 8):
            answers |= await ask_all(fn, items[start : start + 8])
        await fn.aclose()
        outcomes[vote] = answers, fn.statistics(), sim

    def wrong(answers: dict[str, Any]) -> list[str]:
        schema = {"enum": ["even", "odd", "unknown"], "type": "string"}
        return [i for i in items if answers[i] != expected_output(i, schema)]

    plain_answers, plain_stats, _ = outcomes[False]
    voted_answers, stats, sim = outcomes[True]
    degraded = sum(r.degraded for r in sim.requests if r.items > 1)
    assert stats.votes_settled > 0
    assert degraded == stats.votes_settled + 2 * len(wrong(voted_answers))
    assert len(wrong(voted_answers)) * 3 < len(wrong(plain_answers))
    plain_calls = sum(1 for r in sim.requests if r.items == 1)
    assert plain_calls == stats.votes_settled
    assert stats.vote_requests == stats.requests + stats.votes_settled
    # The one-per-item baseline is the same; voting's requests are spent, not saved.
    assert stats.input_tokens_one_per_item == plain_stats.input_tokens_one_per_item
    assert stats.estimated_cost > plain_stats.estimated_cost
    assert stats.vote_cost > 0
    # Every token the provider billed is counted, the second orders' too.
    assert stats.input_tokens == sum(r.prompt_tokens for r in sim.requests)


def test_vote_must_be_a_bool() -> None:
    with pytest.raises(coalesce.ConfigurationError, match="vote must be True or False"):
        parity(PositionBiased(), vote="yes")


class SlowPositionBiased(PositionBiased):
    """As :class:`PositionBiased`, every request taking ``seconds`` (virtual time)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    async def __call__(self, request: CompletionRequest) -> str:
        await anyio.sleep(self.seconds)
        return await super().__call__(request)


@pytest.mark.anyio
async def test_no_plain_call_settles_a_vote_after_the_budget_runs_out() -> None:
    # The packed requests take 2.5 s of a 3 s budget: no time for a plain call, so the
    # items the orders disagree on keep the usual order's answer, in time.
    model = SlowPositionBiased(2.5)
    fn = parity(model, max_items=4, packing="always", vote=True, latency_budget=3.0)
    numbers = ["10", "21", "32", "43"]
    started = anyio.current_time()
    answers = await ask_all(fn, numbers)
    assert anyio.current_time() - started <= 3.0
    assert model.plain == []
    first, second = model.packed  # sent at once: either may be the usual order
    assert second == first[::-1]
    wrong = [n for n in numbers if answers[n] != PositionBiased.right(n)]
    assert len(wrong) == 1
    assert wrong[0] in (first[-1], second[-1])
    stats = fn.statistics()
    assert (stats.votes_settled, stats.votes_unsettled) == (0, 2)


class Billed(PositionBiased):
    """As :class:`PositionBiased` but always right, each reply reporting its usage:
    ``answer`` output tokens per item it answers, and the prompt's tokens plus
    ``template`` (what a provider wraps every request in)."""

    def __init__(self, answer: int, template: int = 0) -> None:
        super().__init__()
        self.answer, self.template = answer, template
        self.count = coalesce.TiktokenEstimator().count

    async def __call__(self, request: CompletionRequest) -> Completion:
        text = await super().__call__(request)
        try:
            items = json.loads(request.user)
        except ValueError:
            items = None
        count = len(items) if isinstance(items, list) else 1
        if isinstance(items, list):  # right answers in both orders: nothing to settle
            text = json.dumps(
                {"results": {str(i["id"]): self.right(str(i["input"])) for i in items}}
            )
        prompt = self.count(request.system) + self.count(request.user)
        schema = json.dumps(request.reply_schema or {}, separators=(",", ":"))
        usage = Usage(prompt + self.count(schema) + self.template, self.answer * count)
        return Completion(text=text, finish_reason="stop", usage=usage)


async def groups_of_four(fn: Any, groups: int) -> list[str]:
    """Ask ``groups`` groups of four numbers, one group after the other; the numbers."""
    numbers = [str(n) for n in range(10, 10 + 4 * groups)]
    for start in range(0, len(numbers), 4):
        group = numbers[start : start + 4]
        assert await ask_all(fn, group) == {n: PositionBiased.right(n) for n in group}
    return numbers


def test_voting_turns_on_the_answers_size_and_each_requests_overhead() -> None:
    # The premises of the next tests: with 60-token answers (paid twice when voting),
    # two packed requests cost more than plain calls; with 3-token answers, less...
    long = costs(f"Parity. {RULES}")
    at = {"item_tokens": 8, "items": 4}
    assert not voting_pays(long, GPT_4O_MINI, None, output_tokens=4 * 60, **at)
    assert voting_pays(long, GPT_4O_MINI, None, output_tokens=4 * 3, **at)
    # ...and what every request costs beyond the estimate favours fewer requests.
    medium = costs(MEDIUM)
    assert not voting_pays(medium, GPT_4O_MINI, None, output_tokens=4 * 3, **at)
    assert voting_pays(medium, GPT_4O_MINI, None, output_tokens=4 * 3, overheads=(250, 250), **at)


@pytest.mark.anyio
async def test_voting_follows_the_answer_size_the_replies_report() -> None:
    # Declared answers of 60 tokens keep the first group plain; its replies report
    # 3-token answers, so the later groups are voted on.
    model = Billed(answer=3)
    fn = parity(model, max_items=4, packing="always", vote=True, expected_output_tokens=60)
    numbers = await groups_of_four(fn, 4)
    assert sorted(model.plain) == numbers[:4]  # the first group, asked plain
    assert len(model.packed) == 2 * 3  # each later group, in two orders
    assert fn.statistics().vote_requests == 3


MEDIUM = f"Parity. {RULES[:400]}"


@pytest.mark.anyio
async def test_voting_follows_what_each_request_costs_beyond_the_estimate() -> None:
    # A provider that adds 250 prompt tokens to every request: coalesce's estimates
    # do not see them, the first group's plain calls report them, and with them
    # voting pays (fewer requests).
    for template, voted in ((0, 0), (250, 3)):
        model = Billed(answer=3, template=template)
        fn = coalesce.prompt(
            client=model, model="gpt-4o-mini", instructions=MEDIUM, max_wait=1.0,
            max_items=4, packing="always", vote=True,
        )(parity_of)  # fmt: skip
        numbers = await groups_of_four(fn, 4)
        assert sorted(model.plain[:4]) == numbers[:4]  # nothing reported yet: plain
        assert len(model.packed) == 2 * voted
        assert fn.statistics().vote_requests == voted


def report(keys: list[str], usage: Usage | None) -> RequestReport:
    completion = Completion(text="{}", finish_reason="stop", usage=usage)
    slots = {str(i): [Job(key, key, math.inf)] for i, key in enumerate(keys)}
    return RequestReport(
        slots=slots, plain=len(keys) == 1, text=False, reask=False, completion=completion,
        error=None, error_headers={}, outcomes={}, streamed=False, seconds=1.0, now=0.0,
    )  # fmt: skip


def test_vote_costs_start_from_the_estimates_and_follow_the_reported_usage() -> None:
    count = coalesce.TiktokenEstimator().count
    learned = VoteCosts(60, costs(MEDIUM), count)
    one, four = ['"10"'], ['"10"', '"11"', '"12"', '"13"']
    assert learned.answer_tokens() == 60
    assert learned.overheads() == (0.0, 0.0)
    learned.request_done(report(four, None))  # no usage reported: nothing learned
    for _ in range(3):  # plain calls costing 40 tokens more than estimated
        learned.request_done(report(one, Usage(learned.estimate(one) + 40, 3)))
    assert learned.answer_tokens() == 3
    assert learned.overheads() == (40, 40)  # packed requests not seen: the plain calls'
    for extra in (10, 12, 14, 500):  # packed requests, one odd one
        learned.request_done(report(four, Usage(learned.estimate(four) + extra, 20)))
    assert learned.overheads() == (40, 12)  # medians
    assert learned.answer_tokens() == 5  # the median of 3, 3, 3, 5, 5, 5, 5 per answer
