"""Model prices (mlrb/models/prices.py): genai-prices' table, per provider and model, for every
model an agent config can name; a config's price overrides it; a model with neither is a
one-line config error before the run starts; nothing is fetched to price a call. The configs'
default models are current ones: priced by the table and not among the retired."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from conftest import REPO, run_cli
from mlrb.agents.command import parse_options as command_options
from mlrb.agents.llm import LlmAgent
from mlrb.agents.llm import parse_options as llm_options
from mlrb.agents.llm import price_of as llm_price
from mlrb.core.config import AgentConfig, ConfigError
from mlrb.models import prices

pytestmark = pytest.mark.fast

AGENT_CONFIGS = sorted((REPO / "mlrb" / "conf" / "agent").glob("*.yaml"))
KEY_ENV = "MLRB_TEST_PRICES_KEY"


def configured_prices() -> list[prices.Price]:
    """The price of every model the agent configs name (a model left to the user, ???, aside):
    an LLM agent's, and a command agent's `model` and side models."""
    found = []
    for path in AGENT_CONFIGS:
        raw = yaml.safe_load(path.read_text())
        cfg = AgentConfig(name=raw["name"], kind=raw["kind"], options=raw.get("options") or {})
        if raw["kind"] == "llm" and raw["options"]["model"] != "???":
            found.append(llm_price(llm_options(cfg)))
        elif raw["kind"] == "command":  # agent=command's program is the user's to name
            cfg.options = {**cfg.options, "command": cfg.options.get("command") or "true"}
            for name, provider in command_options(cfg).providers.items():
                found += [prices.price_of(name, model, provider.price_input_per_mtok, provider.price_output_per_mtok,
                                          f"agent.options.providers.{name}") for model in provider.models]  # fmt: skip
    return found


def test_every_model_an_agent_config_names_has_a_price_from_the_table_with_its_source_and_date():
    found = {(p.provider, p.model): p for p in configured_prices()}
    assert set(found) == {("anthropic", "claude-sonnet-5"), ("anthropic", "claude-haiku-4-5"), ("openai", "gpt-4o"),
                          ("openai", "gpt-5")}  # fmt: skip
    for price in found.values():
        assert price.source.startswith("genai-prices 0.2.3, ") and ", as of 20" in price.source, price.source
        assert price.input_per_mtok > 0 and price.output_per_mtok > price.input_per_mtok
    sonnet = found[("anthropic", "claude-sonnet-5")]
    assert (sonnet.input_per_mtok, sonnet.output_per_mtok) == (2.0, 10.0)
    # The paper's model, retired upstream, is still in the table, at the price it had.
    paper = prices.price_of("anthropic", "claude-3-5-sonnet-20240620", None, None, "agent.options")
    assert (paper.input_per_mtok, paper.output_per_mtok) == (3.0, 15.0) and "anthropic.com/pricing" in paper.source
    assert paper.usd(1_000_000, 100_000) == pytest.approx(3.0 + 1.5)


def test_the_default_models_are_current_and_the_paper_s_retired_one_is_a_documented_override():
    """No config's default is a model its provider has retired or will retire (prices.RETIRED, the
    one list of them); agent=claude's file says how to ask for the paper's model, and that
    Anthropic retired it."""
    for price in configured_prices():
        assert prices.retired_on(price.provider, price.model) is None, (price.provider, price.model)
    assert prices.retired_on("anthropic", "claude-3-5-sonnet-20240620") == "2025-10-22"
    assert prices.retired_on("anthropic", "claude-sonnet-4-5") == "2026-11-30"
    claude = (REPO / "mlrb" / "conf" / "agent" / "claude.yaml").read_text()
    assert "agent.options.model=claude-3-5-sonnet-20240620" in claude and "retired" in claude
    for path in AGENT_CONFIGS:  # every retired model a config quotes is that one override
        for model in prices.RETIRED["anthropic"]:
            assert model not in path.read_text() or (path.name, model) == ("claude.yaml", "claude-3-5-sonnet-20240620")


def test_the_table_s_tiers_apply_a_long_prompt_costs_what_the_provider_bills():
    """Claude Sonnet 4.5 costs twice as much per token once a prompt is past 200k tokens."""
    sonnet = prices.price_of("anthropic", "claude-sonnet-4-5", None, None, "agent.options")
    assert sonnet.usd(100_000, 1_000) == pytest.approx((100_000 * 3 + 1_000 * 15) / 1e6)
    assert sonnet.usd(250_000, 1_000) == pytest.approx((250_000 * 6 + 1_000 * 22.5) / 1e6)


def test_a_price_in_the_config_overrides_the_table_and_a_model_with_none_is_a_one_line_config_error():
    assert prices.price_of("openai", "local-llama", 0.0, 0.0, "agent.options").usd(10**6, 10**6) == 0
    cheaper = prices.price_of("anthropic", "claude-opus-4-1", 1.0, None, "agent.options")  # the output from the table
    assert (cheaper.input_per_mtok, cheaper.output_per_mtok) == (1.0, 75.0)
    with pytest.raises(ConfigError) as e:
        prices.price_of("openai", "local-llama", None, 0.5, "agent.options")
    assert str(e.value) == ("model 'local-llama' has no price in the genai-prices table for openai: set "
                            "agent.options.price_input_per_mtok (USD per million tokens; 0 for a model that "
                            "costs nothing)")  # fmt: skip


def test_a_model_with_no_price_is_refused_before_the_run_starts(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test")
    options = yaml.safe_load((REPO / "mlrb" / "conf" / "agent" / "claude.yaml").read_text())["options"]
    cfg = AgentConfig(name="claude", kind="llm", options={**options, "api_key_env": KEY_ENV, "model": "claude-next"})
    with pytest.raises(ConfigError, match="model 'claude-next' has no price"):
        LlmAgent.check_config(cfg)
    # As a user meets it: one line, naming the model and the keys to set, and no run.
    result = run_cli("agent=claude", "agent.options.model=claude-next", cwd=tmp_path, env={"ANTHROPIC_API_KEY": "x"})
    assert result.returncode == 2 and not (tmp_path / "outputs").exists()
    (line,) = result.stderr.strip().splitlines()
    assert ("model 'claude-next' has no price in the genai-prices table for anthropic: set "
            "agent.options.price_input_per_mtok and agent.options.price_output_per_mtok") in line  # fmt: skip


def test_a_command_agent_lists_the_models_it_may_call():
    options = {"command": "true", "providers": {"anthropic": {"api_key_env": KEY_ENV}}}
    with pytest.raises(ConfigError, match=r"agent.options.providers.anthropic.models must list the models the "
                                          r"program may call, e.g. \[claude-sonnet-5\], or agent.options.model "
                                          r"name one"):  # fmt: skip
        command_options(AgentConfig(name="command", kind="command", options=options))


# Prices every configured model and a call, with an audit hook that records any socket the
# process would open or any name it would look up.
OFFLINE = """
import sys
opened = []
sys.addaudithook(lambda event, args: opened.append(event) if event.startswith(("socket.", "urllib.")) else None)
from mlrb.models import prices
for provider, model in [("anthropic", "claude-sonnet-5"), ("anthropic", "claude-3-5-sonnet-20240620"),
                        ("openai", "gpt-4o"), ("openai", "gpt-5")]:
    prices.price_of(provider, model, None, None, "agent.options").usd(1000, 100)
print(sorted(set(opened)))
"""


def test_prices_come_from_the_installed_table_with_no_network():
    done = subprocess.run([sys.executable, "-c", OFFLINE], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
