"""``coalesce serve``'s settings: flags, environment, file, defaults; checked once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coalesce import ConfigurationError
from coalesce._gateway.config import DEFAULTS, GatewayConfig, load_config
from coalesce.cli import main


def test_the_defaults() -> None:
    config = load_config([], {})
    assert config == GatewayConfig()
    assert (config.host, config.budget, config.lane, config.holds_keys) == (
        "127.0.0.1", None, "auto", False,
    )  # fmt: skip
    assert config.max_items == DEFAULTS["max_items"]


def test_a_flag_beats_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps({"budget": 1, "max_items": 8, "lane": "realtime", "port": 9000}))
    env = {"COALESCE_BUDGET": "3", "COALESCE_MAX_ITEMS": "12"}
    config = load_config(["--config", str(path), "--budget", "5"], env)
    settings = (config.budget, config.max_items, config.lane, config.port)
    assert settings == (5.0, 12, "realtime", 9000)


def test_api_key_mode_takes_the_upstream_keys_from_the_environment() -> None:
    env = {"COALESCE_API_KEYS": "a, b", "OPENAI_API_KEY": "sk-up"}
    config = load_config([], env)
    assert config.api_keys == ("a", "b")
    assert config.openai_api_key == "sk-up"
    assert config.holds_keys
    assert "sk-up" not in repr(config)
    assert "sk-up" not in config.describe()
    assert "'a'" not in repr(config)
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        load_config(["--api-key", "a"], {})


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["--budget", "-1"], {}, "budget must be a finite number of seconds > 0"),
        (["--budget", "nan"], {}, "budget"),
        ([], {"COALESCE_MAX_ITEMS": "many"}, "max_items must be a whole number"),
        (["--max-items", "0"], {}, "max_items must be an integer >= 1"),
        (["--openai-upstream", "api.openai.com"], {}, "http:// or https://"),
        (["--port", "70000"], {}, "port must be from 0 to 65535"),
        ([], {"COALESCE_LANE": "slow"}, "lane must be one of"),
    ],
)
def test_a_bad_setting_is_refused_by_name(argv: list[str], env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        load_config(argv, env)


def test_the_store_and_the_deferred_lanes_are_settings(tmp_path: Path) -> None:
    assert load_config(["--store", "jobs.db"], {}).store == Path("jobs.db")
    assert load_config(["--lane", "batch"], {}).lane == "batch"
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps({"store": "other.db", "lane": "flex"}))
    from_file = load_config(["--config", str(path)], {})
    assert (from_file.store, from_file.lane) == (Path("other.db"), "flex")


def test_a_bad_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps({"budjet": 1}))
    with pytest.raises(ConfigurationError, match="unknown settings \\['budjet'\\]"):
        load_config(["--config", str(path)], {})
    path.write_text("[1]")
    with pytest.raises(ConfigurationError, match="object of settings"):
        load_config(["--config", str(path)], {})
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_config(["--config", str(tmp_path / "missing.json")], {})


def test_the_command_line_reports_a_bad_setting_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--budget", "0"]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip()
        == "coalesce serve: error: budget must be a finite number of seconds > 0, got 0.0"
    )
