"""Reading the fields both chat APIs share: model, messages, token limits, text parts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._http import HttpError

__all__ = ["content_texts", "conversation", "max_tokens", "require_messages", "require_str"]


def content_texts(content: Any) -> list[str]:
    """Return the text parts of a message's ``content`` (a string or a list of parts)."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, Mapping) and "content" in part:
                texts.extend(content_texts(part["content"]))
        return texts
    return []


def require_str(body: Mapping[str, Any], key: str) -> str:
    """Return the required non-empty string field ``key`` of ``body``.

    Raises:
        HttpError: The field is missing, empty or not a string.
    """
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise HttpError(400, f"'{key}' is required and must be a non-empty string")
    return value


def require_messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Return the request's ``messages``: a non-empty list of objects.

    Raises:
        HttpError: ``messages`` is missing or malformed.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "'messages' is required and must be a non-empty list")
    if not all(isinstance(m, Mapping) for m in messages):
        raise HttpError(400, "every message must be an object")
    return messages


def max_tokens(body: Mapping[str, Any], *keys: str) -> int | None:
    """Return the first of ``keys`` (names of the limit, in order of precedence) present
    in ``body``, a positive integer, or ``None``.

    Raises:
        HttpError: The limit is not a positive integer.
    """
    for key in keys:
        value = body.get(key)
        if value is not None:
            if not isinstance(value, int) or value < 1:
                raise HttpError(400, f"'{key}' must be a positive integer, got {value!r}")
            return value
    return None


def conversation(messages: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """Return every text of the messages, and the text parts of the last user message."""
    texts: list[str] = []
    user_parts: list[str] = []
    for message in messages:
        parts = content_texts(message.get("content"))
        texts.extend(parts)
        if message.get("role") == "user":
            user_parts = parts
    return texts, user_parts
