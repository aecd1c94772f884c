"""The header controls, the credentials and the request shapes: pure, no server."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from coalesce import ConfigurationError
from coalesce._gateway.callers import Unauthorized, bearer, read_caller
from coalesce._gateway.controls import read_controls, reply_headers, served_lane
from coalesce._gateway.errors import error_body
from coalesce._gateway.logs import label
from coalesce._gateway.proxy import provider_of, upstream_url
from coalesce._gateway.routes import sdk_arguments


def test_controls_default_to_the_gateways_settings() -> None:
    controls = read_controls([("content-type", "x")], budget=2.0, lane="auto")
    assert (controls.lane, controls.budget, dict(controls.forwarded), controls.coalesce) == (
        "auto", 2.0, {}, True,
    )  # fmt: skip


def test_controls_read_a_calls_own_headers() -> None:
    headers = [
        ("x-coalesce-budget", "0.5"),
        ("X-Coalesce-Lane", " Realtime "),
        ("x-coalesce-partition", "acme"),
        ("x-coalesce", "off"),
    ]
    controls = read_controls(headers, budget=None, lane="auto")
    assert (controls.lane, controls.budget, controls.coalesce) == ("realtime", 0.5, False)
    # What wrap reads goes to it, the lane too: wrap routes the call to its lane.
    assert dict(controls.forwarded) == {
        "x-coalesce-budget": "0.5", "x-coalesce-lane": " Realtime ",
        "x-coalesce-partition": "acme", "x-coalesce": "off",
    }  # fmt: skip


@pytest.mark.parametrize("lane", ["flex", "batch", "auto", "realtime"])
def test_every_lane_may_be_asked_for(lane: str) -> None:
    controls = read_controls([("x-coalesce-lane", f" {lane.title()} ")], budget=None, lane="auto")
    assert controls.lane == lane


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ([("x-coalesce-budget", "abc")], "x-coalesce-budget"),
        ([("x-coalesce-budget", "0")], "x-coalesce-budget"),
        ([("x-coalesce-budget", "inf")], "x-coalesce-budget"),
        (
            [("x-coalesce-lane", "slow")],
            "x-coalesce-lane header must be one of auto, realtime, flex, batch, got 'slow'",
        ),
        ([("x-coalesce-partition", " ")], "x-coalesce-partition"),
        ([("x-coalesce", "no")], "'on' or 'off'"),
        ([("x-coalesce-budjet", "1")], "unknown coalesce header 'x-coalesce-budjet'"),
        ([("x-coalesce-lane", "flex"), ("x-coalesce-lane", "batch")], "given twice"),
    ],
)
def test_a_bad_control_header_is_refused_by_name(headers: list[tuple[str, str]], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        read_controls(headers, budget=None, lane="auto")


def test_the_lane_served_is_the_one_asked_where_offered_else_real_time() -> None:
    for asked in ("realtime", "flex", "batch"):
        assert served_lane(asked) == asked
    assert served_lane("auto") == "realtime"  # until wrap's reply says which lane answered
    assert served_lane("batch", frozenset({"realtime", "flex"})) == "realtime"


def test_reply_headers_say_what_is_known() -> None:
    assert reply_headers(lane="realtime", group_size=None, request_id=None) == {
        "x-coalesce-lane": "realtime"
    }
    assert reply_headers(lane="realtime", group_size=3, request_id="chatcmpl-1") == {
        "x-coalesce-lane": "realtime",
        "x-coalesce-group-size": "3",
        "x-coalesce-request-id": "chatcmpl-1",
    }


def test_a_caller_is_its_credential_and_identity() -> None:
    one = read_caller("openai", {"authorization": "Bearer sk-1", "openai-project": "p"})
    assert dict(one.options) == {"api_key": "sk-1", "project": "p"}
    assert one.partition is None
    two = read_caller("openai", {"authorization": "Bearer sk-2", "openai-project": "p"})
    again = read_caller("openai", {"authorization": "bearer sk-1", "openai-project": "p"})
    assert one.digest != two.digest
    assert one.digest == again.digest
    assert "sk-1" not in repr(one)
    claude = read_caller("anthropic", {"x-api-key": "sk-ant"})
    assert dict(claude.options) == {"api_key": "sk-ant"}


def test_api_key_mode_checks_the_key_and_partitions_by_it() -> None:
    keys = ("gw-1", "gw-2")
    first = read_caller("openai", {"authorization": "Bearer gw-1"}, keys)
    second = read_caller("anthropic", {"x-api-key": "gw-2"}, keys)
    assert dict(first.options) == {}
    assert dict(second.options) == {}
    assert first.partition is not None
    assert first.partition != second.partition
    with pytest.raises(Unauthorized, match="does not accept") as refused:
        read_caller("openai", {"authorization": "Bearer gw-3"}, keys)
    assert "gw-3" not in str(refused.value)
    with pytest.raises(Unauthorized, match="no API key"):
        read_caller("openai", {"authorization": "Basic abc"}, keys)


def test_bearer_reads_only_a_bearer_token() -> None:
    assert bearer({"authorization": "Bearer  tok "}) == "tok"
    assert bearer({"authorization": "Bearer"}) is None
    assert bearer({"authorization": "Basic abc"}) is None
    assert bearer({}) is None


def test_sdk_arguments_keep_unknown_fields_in_extra_body() -> None:
    create = type(openai.AsyncOpenAI(api_key="x").chat.completions).create
    body: dict[str, Any] = {
        "model": "m", "messages": [], "temperature": 0, "brand_new": 1,
        "extra_headers": {"authorization": "Bearer stolen"}, "timeout": 1,
    }  # fmt: skip
    kwargs = sdk_arguments(create, body, {"x-coalesce-budget": "1"})
    assert kwargs == {
        "model": "m",
        "messages": [],
        "temperature": 0,
        # transport arguments are never read from a body: sent as fields, not obeyed
        "extra_body": {
            "brand_new": 1,
            "extra_headers": {"authorization": "Bearer stolen"},
            "timeout": 1,
        },
        "extra_headers": {"x-coalesce-budget": "1"},
    }
    with pytest.raises(ConfigurationError, match="lacks messages"):
        sdk_arguments(create, {"model": "m"}, {})


def test_a_request_goes_to_its_provider_under_its_base_url() -> None:
    assert provider_of({"anthropic-version": "2023-06-01"}) == "anthropic"
    assert provider_of({"x-api-key": "k"}) == "anthropic"
    assert provider_of({"authorization": "Bearer k"}) == "openai"
    assert upstream_url("https://api.openai.com/v1", "/v1/files", "a=1") == (
        "https://api.openai.com/v1/files?a=1"
    )
    assert upstream_url("https://api.anthropic.com", "/v1/messages/batches", "") == (
        "https://api.anthropic.com/v1/messages/batches"
    )
    assert upstream_url("http://h/proxy/", "/other", "") == "http://h/proxy/other"


def test_errors_are_in_each_providers_shape() -> None:
    assert error_body("openai", 400, "bad") == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert error_body("openai", 502, "down")["error"]["type"] == "server_error"
    assert error_body("anthropic", 401, "no") == {
        "type": "error", "error": {"type": "authentication_error", "message": "no"},
    }  # fmt: skip
    assert error_body("anthropic", 502, "x")["error"]["type"] == "api_error"


def test_labels_are_plain_names_or_other() -> None:
    assert label("gpt-4o-mini") == "gpt-4o-mini"
    assert label("models/claude-3.5:beta") == "models/claude-3.5:beta"
    assert label("a b") == "other"
    assert label("x" * 81) == "other"
    assert label(None) == "other"
