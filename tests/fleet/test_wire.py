"""What travels between members, and how the fleet's settings are read. Pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from coalesce import ConfigurationError
from coalesce._fleet.connection import FleetSettings, connect_options, shown_url
from coalesce._fleet.wire import (
    Forwarded,
    Reply,
    call_subject,
    decode_call,
    decode_reply,
    encode_call,
    encode_reply,
    member_token,
    ping_subject,
)

SECRET = "sk-wire-secret"


def test_a_forwarded_call_and_its_reply_round_trip() -> None:
    call = Forwarded(
        "openai.chat",
        (("authorization", f"Bearer {SECRET}"),),
        b'{"model":"m"}\xff',
        1.25,
        "k" * 32,
    )
    assert decode_call(encode_call(call)) == call
    reply = Reply(200, (("x-coalesce-group-size", "4"),), b"\x00{}")
    assert decode_reply(encode_reply(reply)) == reply
    assert SECRET not in repr(call)


def test_a_payload_of_another_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="not a forwarded call"):
        decode_call(b'{"v": 99}')
    with pytest.raises(ValueError, match="not a fleet reply"):
        decode_reply(b"[]")


def test_subjects_name_a_member_and_nothing_else() -> None:
    member = member_token("host.example.com pid 7")
    assert member == "host-example-com-pid-7"
    assert call_subject(member) == f"coalesce.fleet.{member}.call"
    assert ping_subject(member) == f"coalesce.fleet.{member}.ping"


def test_a_fleet_url_is_checked_and_its_password_never_shown() -> None:
    with pytest.raises(ConfigurationError, match=r"such as nats://127\.0\.0\.1:4222"):
        FleetSettings("http://127.0.0.1:4222")
    with pytest.raises(ConfigurationError, match=r"\*\*\*@h") as raised:
        FleetSettings("nats://user:hunter2@h:4222,http://user:hunter2@h")
    assert "hunter2" not in str(raised.value)
    settings = FleetSettings("nats://user:hunter2@h:4222")
    assert "hunter2" not in repr(settings)
    assert shown_url(settings.url) == "nats://***@h:4222"
    assert connect_options(settings)["servers"] == ["nats://user:hunter2@h:4222"]


def test_credentials_and_tls_are_passed_to_nats(tmp_path: Path) -> None:
    creds = tmp_path / "user.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\n")
    with pytest.raises(ConfigurationError, match="fleet_tls_ca: no file"):
        FleetSettings("tls://h:4222", creds=creds, tls_ca=tmp_path / "missing.pem")
    options = connect_options(FleetSettings("tls://h:4222", creds=creds))
    assert options["user_credentials"] == str(creds)
    assert options["max_reconnect_attempts"] == -1
