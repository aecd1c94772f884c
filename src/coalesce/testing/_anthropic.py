"""The Anthropic Messages flavour: parse a request, render answers, events and errors."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ._cache import anthropic_cache_request, without_cache_control
from ._engine import Answer, Prompt, ReplyContext
from ._fields import content_texts, conversation, max_tokens, require_messages, require_str
from ._flavour import StreamEvent
from ._http import HttpError
from ._ratelimit import RateDecision, anthropic_headers

__all__ = ["ANTHROPIC", "AnthropicFlavour"]


def _forced_tool(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not isinstance(tools, list) or not tools or not isinstance(choice, Mapping):
        return None
    named = [t for t in tools if isinstance(t, Mapping)]
    if choice.get("type") == "tool":
        matches = [t for t in named if t.get("name") == choice.get("name")]
        if not matches:
            raise HttpError(
                400, f"tool_choice names {choice.get('name')!r}, which is not in 'tools'"
            )
        return matches[0]
    if choice.get("type") == "any" and named:
        return named[0]
    return None


def _output_schema(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The schema of structured outputs: ``output_config.format`` (or the beta's
    ``output_format``) of type ``json_schema``, or ``None``."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, Mapping) else None
    if fmt is None:
        fmt = body.get("output_format")
    if not isinstance(fmt, Mapping):
        return None
    if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), Mapping):
        raise HttpError(
            400, "output_config.format must be {'type': 'json_schema', 'schema': {...}}"
        )
    schema: Mapping[str, Any] = fmt["schema"]
    return schema


class AnthropicFlavour:
    """``POST /v1/messages``."""

    api = "anthropic.messages"
    id_prefix = "msg_sim"
    request_id_header = "request-id"

    def parse(self, body: Mapping[str, Any]) -> Prompt:
        """Return the prompt of a Messages request.

        The system prompt counts as prompt text; a forced tool's ``input_schema``
        (``tool_choice`` ``tool``, or ``any``: the first tool) is the schema of the
        answer, else the structured outputs' ``output_config.format`` schema, answered
        as JSON text; ``cache_control`` marks cache breakpoints.

        Args:
            body: The request body.

        Raises:
            HttpError: ``model``, ``max_tokens`` (required here) or ``messages`` is
                missing or malformed, ``tool_choice`` names an unknown tool,
                ``output_config.format`` is not a JSON schema format, or a
                ``cache_control`` is invalid (or there are more than four).
        """
        model = require_str(body, "model")
        limit = max_tokens(body, "max_tokens")
        if limit is None:
            raise HttpError(400, "'max_tokens' is required")
        messages = require_messages(body)
        texts, user_parts = conversation(messages)
        texts[:0] = content_texts(body.get("system"))
        tool = _forced_tool(body)
        schema = tool.get("input_schema") if tool is not None else None
        if isinstance(body.get("tools"), list):
            texts.append(json.dumps([without_cache_control(t) for t in body["tools"]]))
        output = _output_schema(body)
        if output is not None:
            texts.append(json.dumps(output))
            schema = schema if tool is not None else output
        return Prompt(
            model=model,
            texts=tuple(texts),
            user_parts=tuple(user_parts),
            schema=schema if isinstance(schema, Mapping) else None,
            tool=str(tool.get("name")) if tool is not None else None,
            max_tokens=limit,
            stream=bool(body.get("stream")),
            messages=len(messages),
            cache=anthropic_cache_request(body, messages),
        )

    @staticmethod
    def _stop_reason(answer: Answer) -> str:
        if answer.truncated:
            return "max_tokens"
        return "tool_use" if answer.tool_input is not None else "end_turn"

    def _block(self, answer: Answer, id: str, tool: str | None, *, empty: bool) -> dict[str, Any]:
        if answer.tool_input is not None:
            tool_id = id.replace("msg_", "toolu_", 1)
            return {
                "type": "tool_use",
                "id": tool_id,
                "name": tool,
                "input": {} if empty else answer.tool_input,
            }
        return {"type": "text", "text": "" if empty else answer.text}

    def render(self, answer: Answer, ctx: ReplyContext) -> dict[str, Any]:
        """Return the non-streamed message object."""
        id, model, tool = ctx.id, ctx.prompt.model, ctx.prompt.tool
        return {
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [self._block(answer, id, tool, empty=False)],
            "stop_reason": self._stop_reason(answer),
            "stop_sequence": None,
            "usage": _usage(ctx, answer.completion_tokens),
        }

    def stream(self, answer: Answer, pieces: list[str], ctx: ReplyContext) -> list[StreamEvent]:
        """Return the SSE events of a streamed message: (event, data, weight)."""
        id, tool = ctx.id, ctx.prompt.tool
        start = self.render(answer, ctx)
        start.update(content=[], stop_reason=None, usage=_usage(ctx, 1))
        delta_kind, field = (
            ("input_json_delta", "partial_json")
            if answer.tool_input is not None
            else ("text_delta", "text")
        )
        if answer.tool_input is not None:
            # The input as the model wrote it: a repeated key or a cut shows in the deltas.
            pieces = _json_pieces(answer.text, len(pieces))
        events: list[StreamEvent] = [
            ("message_start", {"type": "message_start", "message": start}, 0),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": self._block(answer, id, tool, empty=True),
                },
                0,
            ),
            ("ping", {"type": "ping"}, 0),
        ]
        for piece in pieces:
            delta = {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": delta_kind, field: piece},
            }
            events.append(("content_block_delta", delta, len(piece)))
        events += [
            ("content_block_stop", {"type": "content_block_stop", "index": 0}, 0),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self._stop_reason(answer), "stop_sequence": None},
                    "usage": {"output_tokens": answer.completion_tokens},
                },
                0,
            ),
            ("message_stop", {"type": "message_stop"}, 0),
        ]
        return events

    @staticmethod
    def error(status: int, message: str, kind: str) -> dict[str, Any]:
        """Return an error body."""
        return {"type": "error", "error": {"type": kind, "message": message}}

    @staticmethod
    def error_kind(status: int) -> str:
        """Return the error type of a status."""
        kinds = {
            400: "invalid_request_error",
            401: "authentication_error",
            404: "not_found_error",
            429: "rate_limit_error",
            503: "overloaded_error",
            529: "overloaded_error",
        }
        return kinds.get(status, "api_error" if status >= 500 else "invalid_request_error")

    @staticmethod
    def rate_headers(decision: RateDecision, unix_now: float) -> dict[str, str]:
        """Return the rate-limit headers."""
        return anthropic_headers(decision, unix_now)

    @staticmethod
    def sse(event: str | None, data: dict[str, Any]) -> bytes:
        """Encode one server-sent event."""
        return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

    done = b""


ANTHROPIC = AnthropicFlavour()


def _json_pieces(text: str, count: int) -> list[str]:
    size = max(1, -(-len(text) // max(1, count)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _usage(ctx: ReplyContext, output_tokens: int) -> dict[str, Any]:
    """``input_tokens`` counts the prompt tokens neither read from nor written to the cache."""
    written = ctx.cache_write_tokens
    return {
        "input_tokens": ctx.prompt_tokens - ctx.cached_tokens - written,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": ctx.cached_tokens,
        "cache_creation": {"ephemeral_5m_input_tokens": written, "ephemeral_1h_input_tokens": 0},
    }
