"""The engines behind a wrapped client: one per kind of call, one recorder per model.

Calls of one kind (equal :attr:`~.call.SdkCall.key`: same model, instructions,
schema and options) sent with the same credentials share an
:class:`~coalesce._engine.engine.Engine`, so only they are packed together; their
usage shares are charged by one :class:`~coalesce._observe.listeners.UsageShares`
listener. A copy of the wrapped client with other credentials or another base URL
(:func:`~.credentials.credentials_key`) sends through a provider of its own
(:meth:`Engines.add_sender`); its statistics are the same recorders'.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from .._engine.engine import Engine
from .._engine.spec import FunctionSpec, Options
from .._observe.listeners import UsageShares
from .._observe.recorder import PromptRecorder, PromptStatistics
from ..providers import Provider
from .call import SdkCall
from .translator import Answer

__all__ = ["Answered", "Engines"]


@dataclass(frozen=True)
class Answered(Answer):
    """An :class:`~.translator.Answer`, and how many calls shared the request that
    answered it (the ``x-coalesce-group-size`` of its raw response).

    Attributes:
        company: Calls in the last request that carried it (1: it went alone).
    """

    company: int = 1


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


class Engines:
    """One engine per kind of call; one recorder per model; usage shares for all."""

    def __init__(self, provider: Provider, options: Options) -> None:
        self._provider = provider
        self._options = options
        self._engines: dict[str, Engine] = {}
        self._recorders: dict[str, PromptRecorder] = {}
        self._shares = UsageShares()
        self._senders: dict[str, Provider] = {}

    def add_sender(self, sender: str, provider: Callable[[], Provider]) -> None:
        """Send the calls of ``sender`` (a :func:`~.credentials.credentials_key`) through
        ``provider()``, made now unless that sender already has one.

        Args:
            sender: The credentials key of a copy of the wrapped client.
            provider: Makes the provider over that copy.
        """
        if sender not in self._senders:
            self._senders[sender] = provider()

    def engine(self, call: SdkCall, sender: str | None = None) -> Engine:
        """The engine serving calls like ``call`` sent by ``sender`` (``None``: the
        wrapped client itself, or a copy with its credentials)."""
        key = call.key if sender is None else f"{sender}:{call.key}"
        engine = self._engines.get(key)
        if engine is None:
            spec = FunctionSpec(
                name=f"wrap:{call.model}",
                provider=self._provider if sender is None else self._senders[sender],
                model=call.model,
                instructions=call.instructions,
                output_schema=call.output_schema or {"type": "string"},
                validate=_validator(call.output_schema),
                request_options=dict(call.options),
            )
            recorder = self._recorder(call.model)
            engine = Engine(
                spec, self._options_for(call), recorder=recorder, observers=[self._shares]
            )
            self._engines[key] = engine
        return engine

    def _options_for(self, call: SdkCall) -> Options:
        # Each call's own cap times max_items (4 while the cap is learned): the planner and
        # admission keep a group's expected output within it, so no reply is cut short;
        # the learning's ceiling here would reserve more than small context windows hold.
        cap = None if call.item_cap is None else call.item_cap * self._options.max_items
        if self._options.max_output_tokens is not None:
            cap = (
                self._options.max_output_tokens
                if cap is None
                else min(cap, self._options.max_output_tokens)
            )
        # Streamed callers get their answer as the split finds it; the others wait for
        # the whole reply anyway (their usage share needs it).
        return self._options.replace(max_output_tokens=cap, stream=call.stream)

    def _recorder(self, model: str) -> PromptRecorder:
        recorder = self._recorders.get(model)
        if recorder is None:
            o = self._options
            recorder = PromptRecorder(f"wrap:{model}", model, prices=o.prices, on_event=o.on_event)
            self._recorders[model] = recorder
        return recorder

    def statistics(self) -> dict[str, PromptStatistics]:
        """A snapshot of each model's recorder."""
        return {model: recorder.snapshot() for model, recorder in self._recorders.items()}

    async def answer(
        self,
        call: SdkCall,
        budget: float | None = None,
        partition: Hashable = None,
        sender: str | None = None,
    ) -> Answered:
        """Await ``call``'s own answer, with its usage share, the reply that carried it
        (the share's ``finished`` event is set once it is final) and how many calls
        that reply answered.

        Args:
            call: The call, as its translator read it.
            budget: Seconds this call may wait (its ``x-coalesce-budget`` header).
            partition: Calls of different partitions never share a request.
            sender: Whose credentials the call is sent with (see :meth:`engine`).
        """
        engine = self.engine(call, sender)
        job = engine.new_job(call.item, budget=budget, partition=partition)
        share = self._shares.track(job)
        try:
            value = await engine.answer(job)
        except BaseException:
            self._shares.forget(job)
            raise
        return Answered(value, call, share, company=max(job.company, 1))

    async def aclose(self) -> None:
        """Close every engine: pending calls are sent now and awaited."""
        for engine in list(self._engines.values()):
            await engine.aclose()
