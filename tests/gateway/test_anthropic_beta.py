"""The beta structured outputs read as ``output_config`` (pure)."""

from __future__ import annotations

from coalesce._gateway.anthropic_beta import STRUCTURED_OUTPUTS_BETA, general_form

SCHEMA = {"type": "json_schema", "schema": {"type": "object", "properties": {}}}


def test_the_beta_output_format_becomes_output_config_and_the_beta_goes() -> None:
    body = {"model": "claude-haiku-4-5", "max_tokens": 10, "output_format": SCHEMA}
    rewritten, betas = general_form(body, [STRUCTURED_OUTPUTS_BETA, "prompt-caching-2024-07-31"])
    assert rewritten == {"model": "claude-haiku-4-5", "max_tokens": 10,
                         "output_config": {"format": SCHEMA}}  # fmt: skip
    assert betas == ["prompt-caching-2024-07-31"]
    assert "output_format" in body  # the caller's body is left as it was


def test_anything_else_is_left_as_it_came() -> None:
    plain = {"model": "m", "max_tokens": 10}
    assert general_form(plain, [STRUCTURED_OUTPUTS_BETA]) == (plain, [STRUCTURED_OUTPUTS_BETA])
    without_beta = {**plain, "output_format": SCHEMA}
    assert general_form(without_beta, []) == (without_beta, [])
    both = {**plain, "output_format": SCHEMA, "output_config": {"effort": "low"}}
    assert general_form(both, [STRUCTURED_OUTPUTS_BETA]) == (both, [STRUCTURED_OUTPUTS_BETA])
