"""``coalesce.wrap(client)``: an ``AsyncOpenAI`` / ``AsyncAnthropic`` that coalesces.

The wrapper has the client's interface; only ``chat.completions.create`` (OpenAI)
and ``messages.create`` (Anthropic) are intercepted. A compatible call (see
:mod:`coalesce._wrap_plan`) becomes one item of a packed request shared with the
calls of the same key; its caller gets a genuine SDK response whose content is its
own answer and whose usage is its share. Anything else goes to the real client.

How a caller learns its usage: the group runner (:func:`~coalesce._group.run_group`)
returns validated values only, so the providers here note each reply (model, id,
usage) in a per-group :class:`_Ledger`, found through a context variable, which
charges it to the jobs that reply carried.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import anyio

from ._batcher import _Window
from ._group import Job, Spec
from ._latency import LatencyPrior
from ._plain import PLAIN_ID
from ._pricing import Price
from ._prompt import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_ITEMS,
    DEFAULT_MAX_WAIT,
    PromptBatcher,
    budget_override,
    with_planner,
    with_token_shares,
)
from ._prompt_stats import EventHook, PromptRecorder, PromptStatistics
from ._tokens import estimator_for
from ._validate import check_int, check_seconds
from ._wrap_plan import Plan, anthropic_plan, openai_plan, overrides, present, split_usage
from ._wrap_stream import CoalescedStream, anthropic_events, openai_chunks
from .providers import AnthropicProvider, Completion, CompletionRequest, OpenAIProvider

__all__ = ["CoalescedClient", "wrap"]

C = TypeVar("C")


@dataclass
class _WrapJob(Job):
    """A job that also collects its share of every reply that carried it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reply: Mapping[str, Any] = field(default_factory=dict)  # the last reply's id, model...
    packed_id: str = ""
    finished: anyio.Event | None = None  # set when its group is done (streamed calls)


class _Ledger:
    """Charges each reply of one group to the jobs it carried."""

    def __init__(self, jobs: list[Any], model: str) -> None:
        self._jobs: list[_WrapJob] = jobs
        self._seen = [job.attempts for job in jobs]
        self._estimator = estimator_for(None)  # weights only: no model-specific warning

    def charge(
        self, request: CompletionRequest, completion: Completion, reply: Mapping[str, Any]
    ) -> None:
        carried = [j for j, seen in zip(self._jobs, self._seen, strict=True) if j.attempts > seen]
        self._seen = [job.attempts for job in self._jobs]
        packed = _loads(request.user)
        outputs = _outputs(completion.text)
        slots = _assign(packed, carried)
        if not slots and len(carried) == 1:  # a group of one, asked as a plain call
            slots = [({"id": PLAIN_ID, "input": carried[0].item}, carried[0])]
        if not slots:
            return
        own_in = [self._estimator.count(_dumps(entry.get("input"))) for entry, _ in slots]
        own_out = [
            self._estimator.count(_dumps(outputs[entry.get("id")]))
            if entry.get("id") in outputs
            else 0
            for entry, _ in slots
        ]
        usage = completion.usage
        totals = (usage.input_tokens, usage.output_tokens) if usage is not None else (0, 0)
        for (entry, job), (p, c) in zip(slots, split_usage(*totals, own_in, own_out), strict=True):
            job.prompt_tokens += p
            job.completion_tokens += c
            job.reply, job.packed_id = reply, str(entry.get("id"))


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _loads(text: str) -> list[dict[str, Any]]:
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return [e for e in value if isinstance(e, dict)] if isinstance(value, list) else []


def _outputs(text: str) -> dict[Any, Any]:
    """Each id's output in a reply, best effort (a damaged reply gives fewer)."""
    try:
        results = json.loads(text).get("results")
    except (ValueError, AttributeError):
        return {}
    if isinstance(results, dict):  # format 2: {"results": {"<id>": <output>, ...}}
        return results
    if not isinstance(results, list):
        return {}
    return {r.get("id"): r.get("output") for r in results if isinstance(r, dict) and "output" in r}


def _assign(
    packed: list[dict[str, Any]], carried: list[_WrapJob]
) -> list[tuple[dict[str, Any], _WrapJob]]:
    """Pair each packed entry with a carried job of the same input."""
    free = list(carried)
    pairs = []
    for entry in packed:
        for job in free:
            if job.item == entry.get("input"):
                pairs.append((entry, job))
                free.remove(job)
                break
    return pairs


_ledger: ContextVar[_Ledger | None] = ContextVar("coalesce_wrap_ledger", default=None)


def _note(request: CompletionRequest, completion: Completion, reply: Mapping[str, Any]) -> None:
    ledger = _ledger.get()
    if ledger is not None:
        ledger.charge(request, completion, reply)


class _Noting:
    """Notes each reply's id, model and usage in the group's ledger."""

    async def complete(
        self, request: CompletionRequest, on_text: Callable[[str], None] | None = None
    ) -> Completion:
        completion: Completion = await super().complete(request, on_text)  # type: ignore[misc]
        _note(request, completion, completion.reply)
        return completion


class _OpenAINoting(_Noting, OpenAIProvider):
    """The OpenAI provider, noting each reply."""


class _AnthropicNoting(_Noting, AnthropicProvider):
    """The Anthropic provider, noting each reply."""


class _WrapBatcher(PromptBatcher):
    """A prompt batcher that opens a ledger for each group it runs."""

    async def _invoke(self, window: _Window) -> Any:
        token = _ledger.set(_Ledger(window.items, self._spec.model))
        try:
            return await super()._invoke(window)
        finally:
            _ledger.reset(token)
            for job in window.items:
                if job.finished is not None:
                    job.finished.set()


@dataclass(frozen=True)
class _Options:
    max_wait: float
    max_items: int
    max_concurrency: int | None
    latency_budget: float | None
    max_attempts: int
    max_retries: int
    max_output_tokens: int | None
    latency_prior: LatencyPrior | None
    prices: Price | Mapping[str, Price] | None = None
    on_event: EventHook | None = None


def _validator(schema: Mapping[str, Any] | None) -> Callable[[Any], Any]:
    """A light check: text for no schema, the JSON type the schema names otherwise."""
    kinds: dict[str, tuple[type, ...]] = {
        "object": (dict,),
        "array": (list,),
        "string": (str,),
        "integer": (int,),
        "number": (int, float),
        "boolean": (bool,),
    }
    expected = kinds.get(str(schema.get("type"))) if schema is not None else (str,)

    def validate(value: Any) -> Any:
        if expected is not None and not isinstance(value, expected):
            raise ValueError(f"expected {expected[0].__name__}, got {type(value).__name__}")
        return value

    return validate


class _Coalescer:
    """One batcher per key; builds the SDK response for each answered call."""

    def __init__(self, provider: OpenAIProvider | AnthropicProvider, options: _Options) -> None:
        self._provider = provider
        self._options = options
        self._batchers: dict[str, _WrapBatcher] = {}
        self._recorders: dict[str, PromptRecorder] = {}

    def _batcher(self, plan: Plan) -> _WrapBatcher:
        batcher = self._batchers.get(plan.key)
        if batcher is None:
            batcher = _WrapBatcher(self._spec(plan), **self._batch_options())
            self._batchers[plan.key] = batcher
        return batcher

    def _batch_options(self) -> dict[str, Any]:
        o = self._options
        return {
            "max_wait": o.max_wait,
            "max_items": o.max_items,
            "max_concurrency": o.max_concurrency,
        }

    def _spec(self, plan: Plan) -> Spec:
        o = self._options
        cap = None if plan.item_cap is None else plan.item_cap * o.max_items
        if o.max_output_tokens is not None:
            cap = o.max_output_tokens if cap is None else min(cap, o.max_output_tokens)
        schema = plan.output_schema if plan.output_schema is not None else {"type": "string"}
        spec = Spec(
            name=f"wrap:{plan.model}",
            provider=self._provider,
            model=plan.model,
            instructions=plan.instructions,
            output_schema=schema,
            validate=_validator(plan.output_schema),
            max_attempts=o.max_attempts,
            max_retries=o.max_retries,
            max_output_tokens=cap,
            # Streamed callers get their answer as the split finds it; the others wait
            # for the whole reply anyway (their usage share needs it).
            stream=plan.stream,
            dedupe=False,
            options=dict(plan.options),
            recorder=self._recorder(plan.model),
        )
        spec = with_token_shares(spec, estimator_for(plan.model))
        if o.latency_budget is None:
            return spec
        limits = {"max_items": o.max_items, "max_wait": o.max_wait}
        return with_planner(spec, limits, None, o.latency_prior)

    def _recorder(self, model: str) -> PromptRecorder:
        recorder = self._recorders.get(model)
        if recorder is None:
            o = self._options
            recorder = PromptRecorder(f"wrap:{model}", model, prices=o.prices, on_event=o.on_event)
            self._recorders[model] = recorder
        return recorder

    def statistics(self) -> dict[str, PromptStatistics]:
        return {model: recorder.snapshot() for model, recorder in self._recorders.items()}

    async def answer(self, plan: Plan) -> tuple[Any, _WrapJob]:
        """Await ``plan``'s own answer; the job carries its usage and reply."""
        batcher = self._batcher(plan)
        now = anyio.current_time()
        budget = plan.budget or budget_override.get() or self._options.latency_budget
        deadline = now + (budget if budget is not None else math.inf)
        job = _WrapJob(item=plan.item, key=_dumps(plan.item), deadline=deadline)
        if plan.stream:
            job.finished = anyio.Event()
        planning = batcher._spec.planner
        if planning is not None:
            job.plan = planning.plan_item(plan.item, None, deadline, now)
        return await batcher.answer(job, now, budget), job

    async def aclose(self) -> None:
        for batcher in list(self._batchers.values()):
            await batcher.aclose()


def _usage_dict(job: _WrapJob, names: tuple[str, str]) -> dict[str, int]:
    return {names[0]: job.prompt_tokens, names[1]: job.completion_tokens}


def openai_response(value: Any, job: _WrapJob, plan: Plan) -> Any:
    """The ``ChatCompletion`` of one answered item."""
    from openai.types.chat import ChatCompletion

    reply = dict(job.reply)
    text = value if plan.output_schema is None else _dumps(value)
    usage = _usage_dict(job, ("prompt_tokens", "completion_tokens"))
    usage["total_tokens"] = job.prompt_tokens + job.completion_tokens
    return ChatCompletion.model_validate(
        {
            **reply,
            "id": f"{reply.get('id', 'chatcmpl-coalesce')}-{job.packed_id}",
            "object": "chat.completion",
            "created": reply.get("created") or 0,
            "model": reply.get("model") or plan.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
    )


def _anthropic_block(value: Any, base: str, plan: Plan) -> dict[str, Any]:
    if plan.tool is not None:
        return {"type": "tool_use", "id": f"toolu_{base}", "name": plan.tool, "input": value}
    text = value if plan.output_schema is None else _dumps(value)
    return {"type": "text", "text": text}


def anthropic_response(value: Any, job: _WrapJob, plan: Plan) -> Any:
    """The ``Message`` of one answered item."""
    from anthropic.types import Message

    reply = dict(job.reply)
    base = f"{reply.get('id', 'msg_coalesce')}_{job.packed_id}"
    return Message.model_validate(
        {
            "id": base,
            "type": "message",
            "role": "assistant",
            "model": reply.get("model") or plan.model,
            "content": [_anthropic_block(value, base, plan)],
            "stop_reason": "tool_use" if plan.tool is not None else "end_turn",
            "stop_sequence": None,
            "usage": _usage_dict(job, ("input_tokens", "output_tokens")),
        }
    )


def _share(job: _WrapJob) -> Callable[[], Awaitable[tuple[int, int]]]:
    """Waits until the job's group is done; then its ``(input, output)`` token share."""

    async def share() -> tuple[int, int]:
        if job.finished is not None:
            await job.finished.wait()
        return job.prompt_tokens, job.completion_tokens

    return share


def openai_stream(value: Any, job: _WrapJob, plan: Plan) -> CoalescedStream[Any]:
    """The chunks of one answered item, as soon as its output is complete.

    The packed reply is still being written, so the chunks carry coalesce's own id
    (``chatcmpl-coalesce-...``) and the requested model name.
    """
    text = value if plan.output_schema is None else _dumps(value)
    reply = {
        "id": f"chatcmpl-coalesce-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": plan.model,
    }
    chunks = openai_chunks(text, reply, include_usage=plan.include_usage, usage=_share(job))
    return CoalescedStream(chunks)


def anthropic_stream(value: Any, job: _WrapJob, plan: Plan) -> CoalescedStream[Any]:
    """The events of one answered item, as soon as its output is complete."""
    base = f"msg_coalesce_{uuid.uuid4().hex}"
    message = {
        "id": base,
        "model": plan.model,
        "stop_reason": "tool_use" if plan.tool is not None else "end_turn",
    }
    block = _anthropic_block(value, base, plan)
    return CoalescedStream(anthropic_events(block, message, usage=_share(job)))


class _Proxy:
    """Delegates every attribute to ``target`` except those in ``own``."""

    def __init__(self, target: Any, own: Mapping[str, Any]) -> None:
        self._target = target
        self._own = dict(own)

    def __getattr__(self, name: str) -> Any:
        own = self.__dict__.get("_own", {})
        if name in own:
            return own[name]
        return getattr(self.__dict__["_target"], name)

    def __repr__(self) -> str:
        return f"<coalesced {self._target!r}>"


class CoalescedClient(_Proxy):
    """What :func:`wrap` returns: the client, with coalescing ``create`` calls.

    Every attribute but ``chat.completions.create`` (OpenAI) / ``messages.create``
    (Anthropic) is the wrapped client's own.
    """

    def __init__(self, client: Any, kind: str, coalescer: _Coalescer) -> None:
        self._coalescer = coalescer
        if kind == "openai":
            completions = _Proxy(client.chat.completions, {"create": self._openai_create})
            own = {"chat": _Proxy(client.chat, {"completions": completions})}
        else:
            own = {"messages": _Proxy(client.messages, {"create": self._anthropic_create})}
        super().__init__(client, {**own, "close": self.aclose})
        self._create = (
            client.chat.completions.create if kind == "openai" else client.messages.create
        )

    async def _openai_create(self, **kwargs: Any) -> Any:
        return await self._route(kwargs, openai_plan, (openai_response, openai_stream))

    async def _anthropic_create(self, **kwargs: Any) -> Any:
        return await self._route(kwargs, anthropic_plan, (anthropic_response, anthropic_stream))

    async def _route(
        self,
        kwargs: dict[str, Any],
        planner: Callable[[Mapping[str, Any], float | None], Plan | None],
        respond: tuple[Callable[[Any, _WrapJob, Plan], Any], Callable[[Any, _WrapJob, Plan], Any]],
    ) -> Any:
        cleaned, switch, budget = overrides(kwargs)
        given = present(cleaned)
        if given.get("stream") is False:
            del given["stream"]  # a non-streamed call, said explicitly
        plan = None if switch == "off" else planner(given, budget)
        if plan is None:
            return await self._create(**cleaned)
        value, job = await self._coalescer.answer(plan)
        whole, streamed = respond
        return (streamed if plan.stream else whole)(value, job, plan)

    def statistics(self) -> dict[str, PromptStatistics]:
        """Immutable snapshots of the coalesced calls, one per model.

        See :class:`~coalesce.PromptStatistics`: latency and budget, tokens, cost and
        savings, requests. Calls passed through to the client are not counted.
        ``wrap`` is typed as the client it wraps; reach this with
        ``typing.cast(coalesce.CoalescedClient, client).statistics()``.
        """
        return self._coalescer.statistics()

    async def aclose(self) -> None:
        """Send pending calls now, wait for them, then close the wrapped client.

        ``await wrapped.close()`` does the same.
        """
        await self._coalescer.aclose()
        await self._target.close()

    async def __aenter__(self) -> CoalescedClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def wrap(
    client: C,
    *,
    max_wait: float = DEFAULT_MAX_WAIT,
    max_items: int = DEFAULT_MAX_ITEMS,
    max_concurrency: int | None = None,
    latency_budget: float | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    max_retries: int | None = None,
    max_output_tokens: int | None = None,
    latency_prior: LatencyPrior | None = None,
    prices: Price | Mapping[str, Price] | None = None,
    on_event: EventHook | None = None,
) -> C:
    """Wrap an ``openai.AsyncOpenAI`` or ``anthropic.AsyncAnthropic`` so compatible calls coalesce.

    The result is typed as the client: code written for the client runs unchanged.

    Args:
        client: The SDK client.
        max_wait: Longest a call waits for company, in seconds (default 0.05).
        max_items: Most items per request (default 8).
        max_concurrency: Most coalesced requests in flight at once (default: no limit).
        latency_budget: Seconds a coalesced call may wait end to end (default: none).
        max_attempts: Requests that may carry one item, re-asks included (default 4).
        max_retries: Retries of a failed request (default: the client's ``max_retries``).
        max_output_tokens: Cap on a packed reply's tokens (default: each call's own cap
            times ``max_items``, or the provider's default).
        latency_prior: What the planner assumes of the provider before measuring it.
        prices: Prices for the statistics' cost estimates (see :func:`~coalesce.price_for`).
        on_event: Called with each call, request, dispatch and retry event.

    Raises:
        ConfigurationError: ``client`` is not an async OpenAI or Anthropic client, or an
            option is out of range.
    """
    from ._client import as_provider

    base = as_provider(client)  # raises ConfigurationError for anything else
    retries = check_int("max_retries", max_retries, minimum=0, optional=True)
    options = _Options(
        max_wait=float(check_seconds("max_wait", max_wait) or 0.0),
        max_items=check_int("max_items", max_items) or DEFAULT_MAX_ITEMS,
        max_concurrency=check_int("max_concurrency", max_concurrency, optional=True),
        latency_budget=check_seconds(
            "latency_budget", latency_budget, positive=True, optional=True
        ),
        max_attempts=check_int("max_attempts", max_attempts) or 1,
        max_retries=retries if retries is not None else int(getattr(client, "max_retries", 2)),
        max_output_tokens=check_int("max_output_tokens", max_output_tokens, optional=True),
        latency_prior=latency_prior,
        prices=prices,
        on_event=on_event,
    )
    if isinstance(base, OpenAIProvider):
        coalescer = _Coalescer(_OpenAINoting(cast(Any, client)), options)
        return cast(C, CoalescedClient(client, "openai", coalescer))
    if isinstance(base, AnthropicProvider):
        coalescer = _Coalescer(_AnthropicNoting(cast(Any, client)), options)
        return cast(C, CoalescedClient(client, "anthropic", coalescer))
    from ._exceptions import ConfigurationError

    raise ConfigurationError(
        f"coalesce.wrap takes an openai.AsyncOpenAI or an anthropic.AsyncAnthropic, got {client!r}"
    )
