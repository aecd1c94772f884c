"""``@coalesce.prompt``: an LLM function whose concurrent calls share one packed prompt.

The decorated function's signature is the item, its return annotation the output
schema and its docstring the shared instructions. Concurrent calls are grouped by a
:class:`~coalesce.Batcher`; each group becomes one request in wire format v1 (see
:mod:`coalesce._packing`), and the reply is split back by id so that each caller
gets its own validated output, as soon as that output is complete when streaming.
Items whose output is missing or invalid are asked again, in smaller groups, then
alone; their neighbours are never failed or re-asked because of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import math
import typing
from collections.abc import Awaitable, Callable, Hashable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Generic, ParamSpec, TypeVar

import anyio
import pydantic
import pydantic_core

from ._batcher import Batcher, _Window
from ._client import as_provider
from ._exceptions import ConfigurationError
from ._group import Job, Planning, Spec, keyed_replies, run_group
from ._latency import LatencyPrior
from ._packing import pack_request
from ._planner import PlanLimits, admit, due, full_after_add
from ._policy import DispatchReason
from ._pricing import Price
from ._prompt_stats import EventHook, PromptRecorder, PromptStatistics
from ._stats import BatcherStatistics
from ._tokens import TokenEstimator, bounded_output_tokens, estimator_for
from ._validate import check_callable, check_int, check_seconds

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_ITEMS",
    "DEFAULT_MAX_WAIT",
    "PromptBatcher",
    "PromptFunction",
    "budget_override",
    "latency_budget",
    "prompt",
    "shared_tokens",
    "with_planner",
    "with_token_shares",
]

P = ParamSpec("P")
Out = TypeVar("Out")

#: Defaults. Group size is an accuracy decision as well as a latency one: small
#: models lose accuracy as more items share a prompt, hosted ones far less (about
#: single-call accuracy at 4-6 items). A 50 ms window bounds the added wait.
DEFAULT_MAX_ITEMS = 8
DEFAULT_MAX_WAIT = 0.05
DEFAULT_MAX_ATTEMPTS = 4
#: Retries of a request that failed as a whole (429, 5xx, timeouts, dropped
#: connections), after the first attempt; never past the callers' budget.
DEFAULT_MAX_RETRIES = 4
#: Output tokens per item the planner assumes before it has seen any reply.
DEFAULT_EXPECTED_OUTPUT_TOKENS = 50

budget_override: ContextVar[float | None] = ContextVar("coalesce_latency_budget", default=None)


@contextlib.contextmanager
def latency_budget(seconds: float | None) -> Iterator[None]:
    """Override the latency budget of the ``coalesce.prompt`` calls made inside.

    ``with coalesce.latency_budget(0.5): await tag(ticket)`` gives that call 0.5 s,
    keeping the function's signature untouched. ``None`` restores each function's own
    budget. (Planning itself is switched on by a function's ``latency_budget=``.)

    Raises:
        ConfigurationError: If ``seconds`` is not a positive number or None.
    """
    value = check_seconds("latency_budget", seconds, positive=True, optional=True)
    token = budget_override.set(value)
    try:
        yield
    finally:
        budget_override.reset(token)


class PromptBatcher(Batcher[Job, Any]):
    """A batcher whose batch function can resolve callers before it returns, and
    which, given a latency budget, sizes each group with the planner."""

    def __init__(self, spec: Spec, **options: Any) -> None:
        self._spec = spec
        self._plans = spec.planner is not None
        super().__init__(_unused, name=spec.name, **options)

    async def answer(self, job: Job, now: float, budget: float | None) -> Any:
        """Await ``job``'s result (it arrived at ``now``), recording the call."""
        recorder = self._spec.recorder
        if recorder is None:
            return await self(job)
        ok = False
        try:
            result = await self(job)
            ok = True
        finally:
            wait = None if job.dispatched_at is None else job.dispatched_at - now
            recorder.call_finished(anyio.current_time() - now, wait=wait, budget=budget, ok=ok)
        return result

    def _dispatch(self, window: _Window, reason: DispatchReason) -> None:
        super()._dispatch(window, reason)
        if self._spec.recorder is not None:
            self._spec.recorder.dispatched(reason, len(window.items))

    def _plan_before(self, window: _Window | None, job: Job, now: float) -> DispatchReason | None:
        planning = self._spec.planner
        assert planning is not None
        assert job.plan is not None
        members = [member.plan for member in window.items] if window is not None else []
        admission = admit(members, job.plan, planning.limits, planning.predict, now)
        if admission.solo:
            if self._spec.recorder is not None:
                predicted = planning.predict(job.plan.input_tokens, job.plan.output_tokens)
                self._spec.recorder.unmeetable(predicted, job.plan.deadline - now)
            return DispatchReason.SOLO
        return admission.dispatch_first

    def _plan_after(self, window: _Window, now: float) -> DispatchReason | None:
        planning = self._spec.planner
        assert planning is not None
        members = [member.plan for member in window.items]
        reason = full_after_add(members, planning.limits)
        if reason is not None:
            return reason
        when = due(members, planning.limits, planning.predict)
        window.due_at, window.due_reason = when.at, when.reason
        if when.at <= now:
            return when.reason
        self._reschedule(when.at)
        return None

    async def _invoke(self, window: _Window) -> Any:
        jobs: list[Job] = window.items
        started = anyio.current_time()
        for job in jobs:
            job.dispatched_at = started

        def settle(job_index: int, outcome: Any) -> None:
            job = jobs[job_index]
            job.outcome, job.done = outcome, True
            self._deliver_one(window, job_index, outcome)

        await run_group(self._spec, jobs, settle)
        return [job.outcome for job in jobs]


async def _unused(items: list[Any]) -> list[Any]:  # pragma: no cover - _invoke replaces it
    raise AssertionError("unreachable")


class PromptFunction(Generic[P, Out]):
    """What ``@coalesce.prompt`` returns: call it like the function it decorates.

    ``await f(*args, **kwargs)`` returns that call's own validated output.
    """

    def __init__(
        self,
        fn: Callable[P, Awaitable[Any]],
        spec: Spec,
        batcher: PromptBatcher,
        partition: Callable[..., Hashable] | None,
        latency_budget: float | None,
    ) -> None:
        self._fn = fn
        self._spec = spec
        self._batcher = batcher
        self._partition = partition
        self._budget = latency_budget
        self._signature = inspect.signature(fn)
        functools.update_wrapper(self, fn)

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Out:
        item = await self._item(args, kwargs)
        key = json.dumps(item, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        now = anyio.current_time()
        budget = budget_override.get()
        if budget is None:
            budget = self._budget
        deadline = now + (budget if budget is not None else math.inf)
        partition = self._partition(*args, **kwargs) if self._partition is not None else None
        job = Job(item=item, key=key, deadline=deadline, partition=partition)
        planning = self._spec.planner
        if planning is not None:
            job.plan = planning.plan_item(item, partition, deadline, now)
        return await self._batcher.answer(job, now, budget)  # type: ignore[no-any-return]

    async def _item(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        produced = await self._fn(*args, **kwargs)
        if produced is not None and produced is not Ellipsis:
            value = produced  # the body formatted its own input
        elif len(bound.arguments) == 1:
            (value,) = bound.arguments.values()
        else:
            value = dict(bound.arguments)
        return pydantic_core.to_jsonable_python(value)

    def statistics(self) -> PromptStatistics:
        """An immutable snapshot: latency and budget, tokens, cost and savings, requests.

        See :class:`~coalesce.PromptStatistics`.
        """
        assert self._spec.recorder is not None
        return self._spec.recorder.snapshot()

    def batcher_statistics(self) -> BatcherStatistics:
        """The underlying batcher's counters (windows, waits, dispatch reasons)."""
        return self._batcher.statistics()

    async def aclose(self) -> None:
        """Send every pending call now, wait for all of them, refuse new calls."""
        await self._batcher.aclose()

    def __repr__(self) -> str:
        return f"<PromptFunction {self._spec.name} model={self._spec.model!r}>"


def prompt(
    *,
    client: Any,
    model: str,
    instructions: str | None = None,
    max_wait: float = DEFAULT_MAX_WAIT,
    max_items: int = DEFAULT_MAX_ITEMS,
    max_concurrency: int | None = None,
    latency_budget: float | None = None,
    partition: Callable[..., Hashable] | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    max_retries: int = DEFAULT_MAX_RETRIES,
    max_output_tokens: int | None = None,
    stream: bool = True,
    dedupe: bool = False,
    expected_output_tokens: int | None = None,
    latency_prior: LatencyPrior | None = None,
    token_estimator: TokenEstimator | None = None,
    prices: Price | Mapping[str, Price] | None = None,
    on_event: EventHook | None = None,
    **request_options: Any,
) -> Callable[[Callable[P, Awaitable[Out]]], PromptFunction[P, Out]]:
    """Turn ``async def f(<item params>) -> Out`` into an LLM call that coalesces.

    The docstring (or ``instructions=``) is the shared instruction, sent once per
    request; the call's arguments are the item (one parameter: its value; several: an
    object of those fields; a body that returns something else than ``None``/``...``
    returns the item itself); the return annotation is the output type, validated
    with pydantic (a pydantic model, ``str``, ``int``, ``Literal``, an ``Enum``,
    ``list[...]``...).

    Args:
        client: An ``openai.AsyncOpenAI``, an ``anthropic.AsyncAnthropic``, a
            :class:`~coalesce.providers.Provider`, or a plain async callable
            ``(CompletionRequest) -> str``.
        model: The model name.
        instructions: The shared instructions (default: the docstring).
        max_wait: Longest a call waits for company, in seconds (default 0.05).
        max_items: Most items per request (default 8).
        max_concurrency: Most requests in flight at once (default: no limit).
        latency_budget: Seconds a caller may wait end to end; re-asks and retries
            that would not fit are not attempted (default: no budget).
        partition: Called with the call's arguments; calls with different keys
            (tenants, users) never share a prompt.
        max_attempts: Requests that may carry one item, re-asks included (default 4).
        max_retries: Retries of a request that failed as a whole (429 honouring
            ``retry-after``, 5xx, timeouts, dropped connections), with backoff and
            never past the callers' budget (default 4).
        max_output_tokens: Cap on each reply's tokens (default: the provider's).
        stream: Stream replies and resolve each caller as soon as its own output is
            complete (default True; providers that cannot stream ignore it).
        dedupe: Identical items in one group share one slot in the prompt.
        expected_output_tokens: Output tokens per item the planner assumes before it
            has learned them from replies (only with ``latency_budget``; default: the
            longest answer the return type allows when it is bounded, such as a model
            of enums and booleans, else 50).
        latency_prior: What the planner assumes of the provider's speed before it has
            measured it (:class:`~coalesce.LatencyPrior`; default: conservative for
            hosted models). Declare it when you know the provider.
        token_estimator: Counts input tokens for the planner (anything with
            ``count(text) -> int``; default: tiktoken in the model's encoding, offline
            fallbacks included).
        prices: A :class:`~coalesce.Price` for ``model``, or a table consulted before
            the defaults, for the estimated cost in :meth:`PromptFunction.statistics`.
        on_event: Called with each call, request, dispatch and retry event.
        **request_options: Passed to the provider unchanged (``temperature=0``...).

    Raises:
        ConfigurationError: An option is out of range, the function is not ``async``,
            it has no instructions, or its return type cannot be validated.
    """
    options = {
        "client": client,
        "model": model,
        "instructions": instructions,
        "max_wait": max_wait,
        "max_items": max_items,
        "max_concurrency": max_concurrency,
        "latency_budget": latency_budget,
        "partition": partition,
        "max_attempts": max_attempts,
        "max_retries": max_retries,
        "max_output_tokens": max_output_tokens,
        "stream": stream,
        "dedupe": dedupe,
        "expected_output_tokens": expected_output_tokens,
        "latency_prior": latency_prior,
        "token_estimator": token_estimator,
        "prices": prices,
        "on_event": on_event,
        **request_options,
    }
    return functools.partial(_decorate, options=options)


def _decorate(
    fn: Callable[P, Awaitable[Out]], *, options: dict[str, Any]
) -> PromptFunction[P, Out]:
    if not inspect.iscoroutinefunction(fn):
        raise ConfigurationError(f"@coalesce.prompt decorates an async def function, got {fn!r}")
    options = dict(options)
    if options.get("client") is None or options.get("model") is None:
        raise ConfigurationError(
            f"@coalesce.prompt on {fn.__qualname__} needs client= (an AsyncOpenAI, AsyncAnthropic,"
            " Provider or async callable) and model= (the model name)"
        )
    client = options.pop("client")
    model = options.pop("model")
    if not isinstance(model, str) or not model:  # (a non-string model is a user error)
        raise ConfigurationError(f"model must be a non-empty string, got {model!r}")
    instructions = options.pop("instructions", None) or inspect.getdoc(fn)
    if not instructions:
        raise ConfigurationError(
            f"{fn.__qualname__} has no instructions: give it a docstring or instructions="
        )
    batch_options: dict[str, Any] = {
        "max_wait": check_seconds("max_wait", options.pop("max_wait", DEFAULT_MAX_WAIT)),
        "max_items": check_int("max_items", options.pop("max_items", DEFAULT_MAX_ITEMS)),
        "max_concurrency": check_int(
            "max_concurrency", options.pop("max_concurrency", None), optional=True
        ),
    }
    budget = check_seconds(
        "latency_budget", options.pop("latency_budget", None), positive=True, optional=True
    )
    partition = check_callable("partition", options.pop("partition", None))
    output_type = _output_type(fn)
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(output_type)
    output_prior = check_int(
        "expected_output_tokens", options.pop("expected_output_tokens", None), optional=True
    )
    latency_prior = options.pop("latency_prior", None)
    estimator = options.pop("token_estimator", None)
    if estimator is not None and not callable(getattr(estimator, "count", None)):
        raise ConfigurationError(
            f"token_estimator must have a count(text) -> int method, got {estimator!r}"
        )
    if latency_prior is not None and not isinstance(latency_prior, LatencyPrior):
        raise ConfigurationError(
            f"latency_prior must be a coalesce.LatencyPrior, got {latency_prior!r}"
        )
    spec = Spec(
        name=fn.__qualname__,
        provider=as_provider(client),
        model=model,
        instructions=instructions,
        output_schema=adapter.json_schema(),
        validate=adapter.validate_python,
        max_attempts=check_int("max_attempts", options.pop("max_attempts", DEFAULT_MAX_ATTEMPTS))
        or 1,
        max_retries=check_int(
            "max_retries", options.pop("max_retries", DEFAULT_MAX_RETRIES), minimum=0
        )
        or 0,
        max_output_tokens=check_int(
            "max_output_tokens", options.pop("max_output_tokens", None), optional=True
        ),
        stream=bool(options.pop("stream", True)),
        dedupe=bool(options.pop("dedupe", False)),
        options=options,
    )
    spec = dataclasses.replace(
        spec,
        recorder=PromptRecorder(
            fn.__qualname__,
            model,
            prices=options.pop("prices", None),
            on_event=options.pop("on_event", None),
        ),
    )
    spec = with_token_shares(spec, estimator or estimator_for(model))
    if budget is not None:
        spec = with_planner(spec, batch_options, output_prior, latency_prior, estimator)
    if partition is not None:
        batch_options["partition"] = _job_partition
    batcher = PromptBatcher(spec, **batch_options)
    return PromptFunction(fn, spec, batcher, partition, budget)


def with_token_shares(spec: Spec, estimator: TokenEstimator) -> Spec:
    """``spec`` with its shared, plain-call and frame token estimates filled in."""
    plain = estimator.count(spec.instructions)
    if spec.provider.structured:
        plain += estimator.count(json.dumps(dict(spec.output_schema), separators=(",", ":")))
    item_frame, answer_frame = frame_tokens(spec, estimator)
    return dataclasses.replace(
        spec,
        shared_tokens=shared_tokens(spec, estimator),
        plain_shared_tokens=plain,
        frame_tokens=item_frame,
        answer_frame_tokens=answer_frame,
    )


def frame_tokens(spec: Spec, estimator: TokenEstimator) -> tuple[int, int]:
    """Tokens each item costs ``spec``'s requests besides its own input and output:
    ``(input, output)``. Input: its ``{"id": ..., "input": ...}`` wrapper and, with
    structured output, its entry in the (pinned) reply schema; output: its key in the
    reply (``"7":`` and a comma)."""
    structured, keyed = spec.provider.structured, keyed_replies(spec)

    def size(n: int) -> int:
        packed = pack_request(
            spec.instructions, [None] * n, spec.output_schema, structured=structured, keyed=keyed
        )
        tokens = estimator.count(packed.user)
        if structured:
            tokens += estimator.count(json.dumps(packed.reply_schema, separators=(",", ":")))
        return tokens

    item = size(2) - size(1) - estimator.count("null")
    return max(0, item), estimator.count('"1":,' if keyed else '{"id":"1","output":},')


def shared_tokens(spec: Spec, estimator: TokenEstimator) -> int:
    """Input tokens every request of ``spec`` pays whatever its items: the system
    message (instructions and reply format) and, with structured output, the reply
    schema the provider is sent (providers count it as input)."""
    packed = pack_request(
        spec.instructions,
        [None],
        spec.output_schema,
        structured=spec.provider.structured,
        keyed=keyed_replies(spec),
    )
    tokens = estimator.count(packed.system)
    if spec.provider.structured:
        tokens += estimator.count(json.dumps(packed.reply_schema, separators=(",", ":")))
    return tokens


def with_planner(
    spec: Spec,
    batch_options: Mapping[str, Any],
    output_prior: int | None,
    latency_prior: LatencyPrior | None,
    estimator: TokenEstimator | None = None,
) -> Spec:
    """Attach a budget planner: token estimates, a learned latency model, limits."""
    limits = PlanLimits(
        max_items=batch_options["max_items"],
        max_wait=batch_options["max_wait"],
        shared_tokens=spec.shared_tokens,
        max_output_tokens=spec.max_output_tokens,
        per_item_overhead_tokens=spec.frame_tokens,
        per_item_output_overhead_tokens=spec.answer_frame_tokens,
        streaming=spec.stream,
    )
    estimator = estimator or estimator_for(spec.model)
    if output_prior is None:
        # A bounded output (a classification, say) has a known longest answer.
        output_prior = bounded_output_tokens(spec.output_schema, estimator)
    planning = Planning(
        spec.model, limits, output_prior or DEFAULT_EXPECTED_OUTPUT_TOKENS, latency_prior, estimator
    )
    return dataclasses.replace(spec, planner=planning)


def _job_partition(job: Job) -> Hashable:
    return job.partition


def _output_type(fn: Any) -> Any:
    """The return annotation, resolved (``from __future__ import annotations`` too)."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot resolve the return annotation of {fn.__qualname__}: {exc}; define the"
            " output type at module level (or import it) so it can be looked up"
        ) from exc
    output = hints.get("return", str)
    if output is Any or output is None or output is type(None):
        return str
    try:
        pydantic.TypeAdapter(output).json_schema()
    except Exception as exc:
        raise ConfigurationError(
            f"the return type of {fn.__qualname__} ({output!r}) cannot be validated and"
            f" described as JSON schema by pydantic: {exc}"
        ) from exc
    return output
