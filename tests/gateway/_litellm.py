"""What the litellm and DSPy tests of the gateway share: the machine kept offline, the
DSPy program, and the answers the simulator gives to what DSPy sends.

litellm reads its cost map (and Anthropic's beta headers) from the network when it is
imported or first calls Anthropic, unless told not to by its environment; DSPy keeps a
disk cache. :func:`offline` sets the environment before either is imported, turns the
caches off and refuses every connection that is not to this machine, so a test that
would reach the network fails instead of quietly falling back.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _traffic import Ticket

from coalesce.testing import expected_output

#: litellm's switches for its bundled cost map and beta headers, and for no fetch at all.
LITELLM_OFFLINE = {
    "LITELLM_OFFLINE_MODE": "true",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
}


def _loopback(host: Any) -> bool:
    if host in (None, "localhost", b"localhost"):
        return True
    try:
        text = host.decode() if isinstance(host, bytes) else str(host)
        return ipaddress.ip_address(text.split("%")[0]).is_loopback
    except ValueError:
        return False


@dataclass
class NetworkGuard:
    """Refuses name lookups and connections beyond loopback, and remembers them."""

    refused: list[str] = field(default_factory=list)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        lookup, connect, connect_ex = (
            socket.getaddrinfo,
            socket.socket.connect,
            socket.socket.connect_ex,
        )

        def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
            self._check(host)
            return lookup(host, *args, **kwargs)

        def guarded(method: Any) -> Any:
            def call(sock: socket.socket, address: Any) -> Any:
                if sock.family in (socket.AF_INET, socket.AF_INET6):
                    self._check(address[0])
                return method(sock, address)

            return call

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        monkeypatch.setattr(socket.socket, "connect", guarded(connect))
        monkeypatch.setattr(socket.socket, "connect_ex", guarded(connect_ex))

    def _check(self, host: Any) -> None:
        if not _loopback(host):
            self.refused.append(str(host))
            raise socket.gaierror(socket.EAI_NONAME, f"no network in tests: {host}")


def offline(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> NetworkGuard:
    """Keep litellm and DSPy off the network and out of their caches; import them.

    Call it before litellm or DSPy is first imported (the cost map is read then).
    """
    for name, value in LITELLM_OFFLINE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DSPY_CACHEDIR", str(cache_dir))  # were DSPy's cache ever built
    guard = NetworkGuard()
    guard.install(monkeypatch)
    import dspy
    import litellm

    monkeypatch.setattr(litellm, "cache", None)
    monkeypatch.setattr(litellm, "telemetry", False, raising=False)
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    return guard


@functools.cache
def triage_signature() -> Any:
    """DSPy's typed signature of the task: ticket -> category, urgency (the types of
    ``Ticket``'s fields)."""
    import dspy

    fields = Ticket.model_fields
    return dspy.make_signature(
        {
            "ticket": (str, dspy.InputField()),
            "category": (fields["category"].annotation, dspy.OutputField()),
            "urgency": (fields["urgency"].annotation, dspy.OutputField()),
        },
        "Classify the support ticket by category and urgency.",
        signature_name="Triage",
    )


def dspy_item(ticket: str) -> str:
    """The user message DSPy's ``JSONAdapter`` sends for ``ticket``: the item the
    gateway packs (or sends alone), whose answer the simulator derives."""
    import dspy

    messages = dspy.JSONAdapter().format(triage_signature(), demos=[], inputs={"ticket": ticket})
    content = messages[-1]["content"]
    assert isinstance(content, str)
    return content


def expected_triage(ticket: str) -> Ticket:
    """The simulator's answer to DSPy's call for ``ticket``. The answer to a schema
    depends on the item and on the fields' names and enums only, so DSPy's own schema
    (``DSPyProgramOutputs``: the same fields) gets the same answer as ``Ticket``'s."""
    schema = Ticket.model_json_schema()
    return Ticket.model_validate(expected_output(dspy_item(ticket), schema))
