"""A minimal ``multipart/form-data`` parser, enough for ``POST /v1/files``."""

from __future__ import annotations

import re

from ._asgi import HttpError

__all__ = ["FormField", "parse_form"]

_BOUNDARY = re.compile(r'boundary="?([^";]+)"?')
_DISPOSITION = re.compile(r'(\w+)="([^"]*)"')


class FormField:
    """One field of a form: its value and, for a file, its filename."""

    def __init__(self, value: bytes, filename: str | None) -> None:
        self.value = value
        self.filename = filename


def parse_form(content_type: str, body: bytes) -> dict[str, FormField]:
    """Return the fields of a multipart body by name.

    Args:
        content_type: The request's ``content-type`` header (carries the boundary).
        body: The raw body.

    Raises:
        HttpError: The body is not multipart/form-data.
    """
    match = _BOUNDARY.search(content_type)
    if not content_type.startswith("multipart/form-data") or match is None:
        raise HttpError(400, "expected a multipart/form-data body")
    delimiter = b"--" + match.group(1).encode("latin-1")
    fields = {}
    for part in body.split(delimiter)[1:]:
        if part.startswith(b"--"):
            break
        head, _, value = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        params = dict(_DISPOSITION.findall(head.decode("utf-8", "replace")))
        if "name" in params:
            fields[params["name"]] = FormField(value.removesuffix(b"\r\n"), params.get("filename"))
    return fields
