"""Pure decisions of :func:`coalesce.wrap`: may a request be coalesced, with which
others, and what share of a packed request's usage each caller gets.

Nothing here does I/O or imports an SDK: the functions read the keyword arguments of
``chat.completions.create`` / ``messages.create`` and return plain values.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._exceptions import ConfigurationError

__all__ = [
    "BUDGET_HEADER",
    "HEADERS",
    "PARTITION_HEADER",
    "SWITCH_HEADER",
    "CallHeaders",
    "Plan",
    "anthropic_plan",
    "coalesce_headers",
    "given_arguments",
    "openai_plan",
]

#: ``extra_headers={"x-coalesce": "off"}`` sends that call alone, untouched.
SWITCH_HEADER = "x-coalesce"
#: ``extra_headers={"x-coalesce-budget": "0.5"}`` gives that call a 0.5 s budget.
BUDGET_HEADER = "x-coalesce-budget"
#: ``extra_headers={"x-coalesce-partition": "tenant-42"}``: calls with different values
#: never share a prompt.
PARTITION_HEADER = "x-coalesce-partition"
#: Every header coalesce reads (and removes before the call is sent).
HEADERS = (SWITCH_HEADER, BUDGET_HEADER, PARTITION_HEADER)

#: What each item is asked, after the caller's own system text.
TASK = "Each item's input is one user message; its output is your reply to that message."

_OPENAI_FORWARDED = frozenset(
    {
        "temperature",
        "top_p",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "reasoning_effort",
        "service_tier",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "metadata",
        "store",
    }
)
_OPENAI_HANDLED = frozenset(
    {"model", "messages", "n", "response_format", "stream", "stream_options"}
)
_OPENAI_CAPS = ("max_completion_tokens", "max_tokens")
_ANTHROPIC_FORWARDED = frozenset({"temperature", "top_p", "top_k", "metadata", "service_tier"})
_ANTHROPIC_HANDLED = frozenset(
    {"model", "messages", "system", "max_tokens", "tools", "tool_choice", "stream", "output_config"}
)


@dataclass(frozen=True)
class Plan:
    """How one compatible request is coalesced.

    Attributes:
        key: Canonical JSON of everything but the item: requests with equal keys share
            a prompt.
        model: The model.
        instructions: The shared instructions (system text and earlier turns).
        item: The last user message's text: the item.
        output_schema: JSON schema of the answer, or ``None`` for plain text.
        options: Sampling options sent with the packed request.
        item_cap: The caller's own output-token cap, if any.
        tool: The forced Anthropic tool whose input is the answer, if any.
        budget: Seconds this call may wait (from the ``x-coalesce-budget`` header).
        stream: The call asked for a stream (``stream=True``).
        include_usage: OpenAI's ``stream_options={"include_usage": True}``.
    """

    key: str
    model: str
    instructions: str
    item: str
    output_schema: Mapping[str, Any] | None
    options: Mapping[str, Any] = field(default_factory=dict)
    item_cap: int | None = None
    tool: str | None = None
    budget: float | None = None
    stream: bool = False
    include_usage: bool = False


def given_arguments(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the SDKs' "not given" sentinels (``NOT_GIVEN``, ``omit``).

    Args:
        kwargs: Keyword arguments of an SDK method.
    """
    return {k: v for k, v in kwargs.items() if type(v).__name__ not in ("NotGiven", "Omit")}


def _canonical(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=repr
    )


@dataclass(frozen=True)
class CallHeaders:
    """What one call asked of coalesce through its ``x-coalesce*`` headers.

    Attributes:
        coalesce: ``False`` for ``x-coalesce: off`` (the call goes to the client alone).
        budget: Seconds the call may wait (``x-coalesce-budget``), if given.
        partition: The call's partition (``x-coalesce-partition``), if given: calls
            with different partitions never share a prompt.
    """

    coalesce: bool = True
    budget: float | None = None
    partition: str | None = None


def coalesce_headers(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], CallHeaders]:
    """Split the coalesce headers off ``extra_headers`` and check them.

    Returns the keyword arguments without them (``extra_headers`` dropped when nothing
    else is left in it) and what they asked.

    Args:
        kwargs: Keyword arguments of an SDK method.

    Raises:
        ConfigurationError: A header starting with ``x-coalesce`` that is not one of
            :data:`HEADERS`, given twice, or with a value its header does not accept.
    """
    headers = kwargs.get("extra_headers")
    if not isinstance(headers, Mapping):
        return dict(kwargs), CallHeaders()
    ours = {k: v for k, v in headers.items() if _is_ours(k)}
    if not ours:
        return dict(kwargs), CallHeaders()
    cleaned = dict(kwargs)
    rest = {k: v for k, v in headers.items() if k not in ours}
    if rest:
        cleaned["extra_headers"] = rest
    else:
        del cleaned["extra_headers"]
    return cleaned, _read_headers(ours)


def _is_ours(name: Any) -> bool:
    return isinstance(name, str) and name.lower().split("-", 2)[:2] == ["x", "coalesce"]


def _read_headers(ours: Mapping[str, Any]) -> CallHeaders:
    found: dict[str, Any] = {}
    for name, value in ours.items():
        key = name.lower()
        if key not in HEADERS:
            raise ConfigurationError(
                f"unknown coalesce header {name!r}; the headers are {', '.join(HEADERS)}"
            )
        if key in found:
            raise ConfigurationError(f"the {key} header is given twice; give it once")
        found[key] = value
    found = given_arguments(found)
    return CallHeaders(
        coalesce=_switch(found.get(SWITCH_HEADER)),
        budget=_seconds(found.get(BUDGET_HEADER)),
        partition=_partition(found.get(PARTITION_HEADER)),
    )


def _switch(value: Any) -> bool:
    if value is None:
        return True
    word = value.strip().lower() if isinstance(value, str) else None
    if word not in ("on", "off"):
        raise ConfigurationError(
            f"the {SWITCH_HEADER} header must be 'on' or 'off' (this call alone, untouched),"
            f" got {value!r}"
        )
    return word == "on"


def _seconds(value: Any) -> float | None:
    """The budget header's seconds: a positive, finite number (or its text)."""
    if value is None:
        return None
    try:
        seconds = float(value) if isinstance(value, (str, int, float)) else math.nan
    except (ValueError, OverflowError):
        seconds = math.nan
    if isinstance(value, bool) or not (math.isfinite(seconds) and seconds > 0):
        raise ConfigurationError(
            f"the {BUDGET_HEADER} header must be a positive, finite number of seconds such"
            f" as '0.5', got {value!r}"
        )
    return seconds


def _partition(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            f"the {PARTITION_HEADER} header must be a non-empty string naming the call's"
            f" partition (a tenant, a user, a trust level), got {value!r}"
        )
    return value


def _text(content: Any) -> str | None:
    """A message's content when it is plain text, else ``None``."""
    return content if isinstance(content, str) else None


def _turns(
    messages: Sequence[Any], system_roles: frozenset[str]
) -> tuple[list[str], list[str]] | None:
    """(system texts, rendered earlier turns), or ``None`` when a turn is not plain text."""
    system: list[str] = []
    turns: list[str] = []
    for message in messages:
        if not isinstance(message, Mapping) or set(message) - {"role", "content", "name"}:
            return None
        text, role = _text(message.get("content")), message.get("role")
        if text is None or role not in system_roles | {"user", "assistant"}:
            return None
        if role in system_roles:
            system.append(text)
        else:
            turns.append(f"[{role}] {text}")
    return system, turns


def _instructions(system: Sequence[str], turns: Sequence[str]) -> str:
    parts = [text for text in system if text.strip()]
    if turns:
        parts.append("The conversation so far, before each item's message:\n" + "\n".join(turns))
    parts.append(TASK)
    return "\n\n".join(parts)


def _last_user(messages: Any) -> tuple[list[Any], str] | None:
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if (
        not isinstance(last, Mapping)
        or last.get("role") != "user"
        or set(last) - {"role", "content"}
    ):
        return None
    item = _text(last.get("content"))
    return None if item is None else (messages[:-1], item)


def _cap(kwargs: Mapping[str, Any], keys: Sequence[str]) -> tuple[bool, int | None]:
    """(valid, cap): the per-item output cap, if one is given as a positive int."""
    for key in keys:
        value = kwargs.get(key)
        if value is not None:
            return (isinstance(value, int) and value > 0), value
    return True, None


def openai_plan(kwargs: Mapping[str, Any], budget: float | None = None) -> Plan | None:
    """The plan of a ``chat.completions.create`` call, or ``None`` to pass it through.

    Coalesced: one user message to answer (plain text), earlier turns of plain text,
    no tools, ``n`` of 1, ``stream`` on or off (``stream_options`` only with
    ``include_usage``), ``response_format`` absent, ``text`` or
    ``json_schema``, and only the sampling options coalesce knows to be per request.

    Args:
        kwargs: The call's keyword arguments, sentinels and coalesce headers removed.
        budget: The call's own budget, if it set one.
    """
    unknown = set(kwargs) - _OPENAI_FORWARDED - _OPENAI_HANDLED - set(_OPENAI_CAPS)
    model, split = kwargs.get("model"), _last_user(kwargs.get("messages"))
    if unknown or not isinstance(model, str) or split is None or kwargs.get("n") not in (None, 1):
        return None
    earlier, item = split
    turns = _turns(earlier, frozenset({"system", "developer"}))
    valid, cap = _cap(kwargs, _OPENAI_CAPS)
    schema = _openai_schema(kwargs.get("response_format"))
    if turns is None or not valid or schema is False:
        return None
    output_schema = schema if isinstance(schema, Mapping) else None
    stream = _stream(kwargs.get("stream"))
    usage = _include_usage(kwargs.get("stream_options"))
    if stream is None or usage is None or (usage and not stream):
        return None
    options = {k: v for k, v in kwargs.items() if k in _OPENAI_FORWARDED}
    plan = _plan(model, _instructions(*turns), item, output_schema, options, cap, None, budget)
    return _streamed(plan, stream, usage)


def _stream(value: Any) -> bool | None:
    """``stream=``: a bool, or absent; ``None`` for anything else (passed through)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    return None


def _include_usage(value: Any) -> bool | None:
    """OpenAI's ``stream_options``: only ``include_usage`` is understood."""
    if value is None:
        return False
    if isinstance(value, Mapping) and set(value) <= {"include_usage"}:
        return bool(value.get("include_usage"))
    return None


def _streamed(plan: Plan, stream: bool, include_usage: bool) -> Plan:
    """``plan`` for a streamed call: its own key, so streamed calls share requests."""
    if not stream:
        return plan
    return dataclasses.replace(
        plan, key=plan.key + ":stream", stream=True, include_usage=include_usage
    )


def _openai_schema(value: Any) -> Mapping[str, Any] | bool | None:
    """The output schema; ``None`` for text; ``False`` for a format not coalesced."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return False
    if value.get("type") == "text":
        return None
    spec = value.get("json_schema")
    if value.get("type") == "json_schema" and isinstance(spec, Mapping):
        schema = spec.get("schema")
        return schema if isinstance(schema, Mapping) else False
    return False


def anthropic_plan(kwargs: Mapping[str, Any], budget: float | None = None) -> Plan | None:
    """The plan of a ``messages.create`` call, or ``None`` to pass it through.

    Coalesced: one user message to answer (plain text), earlier turns of plain text, a
    ``system`` string (or text blocks), no tools except one forced with ``tool_choice``
    (its ``input_schema`` is the output schema) or else an ``output_config`` of a
    ``json_schema`` format alone (its ``schema`` is), ``stream`` on or off, no thinking.

    Args:
        kwargs: The call's keyword arguments, sentinels and coalesce headers removed.
        budget: The call's own budget, if it set one.
    """
    unknown = set(kwargs) - _ANTHROPIC_FORWARDED - _ANTHROPIC_HANDLED
    model, split = kwargs.get("model"), _last_user(kwargs.get("messages"))
    system = _anthropic_system(kwargs.get("system"))
    if unknown or not isinstance(model, str) or split is None or system is None:
        return None
    earlier, item = split
    turns = _turns(earlier, frozenset())
    valid, cap = _cap(kwargs, ("max_tokens",))
    tool = _forced_tool(kwargs.get("tools"), kwargs.get("tool_choice"))
    output = _output_format(kwargs.get("output_config"))
    if turns is None or not valid or tool is False or output is False:
        return None
    if isinstance(tool, tuple) and output is not None:
        return None  # a forced tool and a reply format: which is the answer?
    name, schema = tool if isinstance(tool, tuple) else (None, output)
    stream = _stream(kwargs.get("stream"))
    if stream is None:
        return None
    options = {k: v for k, v in kwargs.items() if k in _ANTHROPIC_FORWARDED}
    instructions = _instructions([system, *turns[0]], turns[1])
    plan = _plan(model, instructions, item, schema, options, cap, name, budget)
    return _streamed(plan, stream, include_usage=False)


def _anthropic_system(value: Any) -> str | None:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str)
        for b in value
    ):
        return "\n\n".join(b["text"] for b in value)
    return None


def _output_format(value: Any) -> Mapping[str, Any] | Literal[False] | None:
    """The schema of ``output_config={"format": {"type": "json_schema", ...}}``;
    ``None`` for none; ``False`` for any other ``output_config``."""
    if value is None:
        return None
    fmt = value.get("format") if isinstance(value, Mapping) and set(value) == {"format"} else None
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
        return False
    schema = fmt.get("schema")
    return schema if isinstance(schema, Mapping) else False


def _forced_tool(tools: Any, choice: Any) -> tuple[str, Mapping[str, Any]] | bool | None:
    """(name, input schema) of a forced tool; ``None`` for no tools; ``False`` otherwise."""
    if tools is None and choice is None:
        return None
    if (
        not isinstance(tools, list)
        or not isinstance(choice, Mapping)
        or choice.get("type") != "tool"
    ):
        return False
    named = [t for t in tools if isinstance(t, Mapping) and t.get("name") == choice.get("name")]
    if len(named) != 1 or not isinstance(named[0].get("input_schema"), Mapping):
        return False
    return str(named[0]["name"]), named[0]["input_schema"]


def _plan(
    model: str,
    instructions: str,
    item: str,
    schema: Mapping[str, Any] | None,
    options: Mapping[str, Any],
    cap: int | None,
    tool: str | None,
    budget: float | None,
) -> Plan:
    key = _canonical([model, instructions, schema, dict(options), cap, tool])
    return Plan(key, model, instructions, item, schema, options, cap, tool, budget)
