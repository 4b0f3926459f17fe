"""Models that exist, at their own prices: `agent.options.model` is the one place an agent's model
is set, for the built-in agents as for Claude Code and Codex (the model their command names, and
the models the run's proxy lets through, each at its own price), and a model the provider does
not have ends the run in one line as a configuration error, not the agent's, against the
stand-in APIs (tests/fake_llm_server.py)."""

from __future__ import annotations

import pytest
import yaml

from conftest import PLUMBING, REPO, mlflow_client, run_cli, store_args
from fake_llm_server import FakeLlmServer, reply, tool
from mlrb.agents.command import CommandAgent
from mlrb.core.config import AgentConfig, ConfigError
from mlrb.models import metering, prices
from mlrb.models.proxy import MeteringProxy, MissingModel, Upstream, model_not_found
from test_command_agent import command_override
from test_sweeps import runs_by_role, sweep_args

KEY = "sk-models-real-key-7070"
KEY_ENV = "MLRB_TEST_MODELS_KEY"
PAPER = "claude-3-5-sonnet-20240620"  # the MLRB paper's model, retired by Anthropic


def command_agent(name: str, **options) -> CommandAgent:
    """agent=NAME (claude_code, codex, command) as its config file sets it up, OPTIONS on top,
    with the test's key."""
    raw = yaml.safe_load((REPO / "mlrb" / "conf" / "agent" / f"{name}.yaml").read_text())["options"]
    raw = {**raw, **options, "command": options.get("command") or raw.get("command") or "true"}
    raw["providers"] = {p: {**v, "api_key_env": KEY_ENV} for p, v in raw["providers"].items()}
    return CommandAgent(AgentConfig(name=name, kind="command", options=raw))


@pytest.mark.fast
def test_claude_code_s_model_is_agent_options_model_and_cfg_job_shows_it(tmp_path):
    result = run_cli("agent=claude_code", "agent.options.model=claude-opus-4-8", "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    options = yaml.safe_load(result.stdout)["agent"]["options"]
    assert options["model"] == "claude-opus-4-8" and '--model "$MLRB_MODEL"' in options["command"]


@pytest.mark.fast
@pytest.mark.parametrize(
    ("agent", "model", "allowed"),
    [
        ("claude_code", "claude-opus-4-8", {"claude-opus-4-8": (5.0, 25.0), "claude-haiku-4-5": (1.0, 5.0)}),
        ("claude_code", None, {"claude-sonnet-5": (2.0, 10.0), "claude-haiku-4-5": (1.0, 5.0)}),
        ("codex", "gpt-5.4-mini", {"gpt-5.4-mini": (0.75, 4.5)}),
        ("codex", None, {"gpt-5": (1.25, 10.0)}),
        ("command", "gpt-5.4-mini", {"gpt-5.4-mini": (0.75, 4.5), "gpt-5": (1.25, 10.0)}),
    ],
)  # fmt: skip
def test_the_proxy_allows_agent_options_model_and_the_listed_side_models_each_at_its_own_price(
    monkeypatch, agent, model, allowed
):
    """The model set in agent.options.model (or the config's default) is allowed at the provider
    that serves it, beside the side models the config lists; the price table prices each alone."""
    monkeypatch.setenv(KEY_ENV, KEY)
    upstreams = command_agent(agent, **({"model": model} if model else {})).model_upstreams()
    provider = "anthropic" if "claude" in next(iter(allowed)) else "openai"
    models = upstreams[provider].models or {}
    assert {m: (p.input_per_mtok, p.output_per_mtok) for m, p in models.items()} == allowed
    assert all(p.source.startswith("genai-prices ") for p in models.values())


@pytest.mark.fast
def test_a_model_no_configured_provider_is_known_to_serve_or_none_where_the_command_wants_one_is_one_line(
    monkeypatch,
):
    monkeypatch.setenv(KEY_ENV, KEY)
    with pytest.raises(ConfigError) as e:
        command_agent("command", model="my-local-model")
    assert str(e.value) == ("agent.options.model=my-local-model: say which provider serves it, listing it in "
                            "agent.options.providers.anthropic.models or agent.options.providers.openai.models")  # fmt: skip
    listed = {"anthropic": {"models": []}, "openai": {"models": ["my-local-model"], "price_input_per_mtok": 0,
                                                      "price_output_per_mtok": 0}}  # fmt: skip
    agent = command_agent("command", model="my-local-model", providers=listed)
    assert set(agent.model_upstreams()["openai"].models or {}) == {"my-local-model"}
    with pytest.raises(ConfigError) as e:  # Claude Code's command names the model: it must be set
        command_agent("claude_code", model=None)
    assert str(e.value) == ("agent.options.command names $MLRB_MODEL, and agent.options.model is not set: name the "
                            "model, e.g. agent.options.model=claude-sonnet-5")  # fmt: skip


@pytest.mark.fast
def test_the_proxy_knows_each_provider_s_model_not_found_answer_and_no_other_404():
    anthropic = {"type": "error", "error": {"type": "not_found_error", "message": f"model: {PAPER}"}}
    openai = {"error": {"message": "The model `gpt-4` does not exist", "type": "invalid_request_error",
                        "param": None, "code": "model_not_found"}}  # fmt: skip
    assert model_not_found("anthropic", 404, anthropic) == f"model: {PAPER}"
    assert model_not_found("openai", 404, openai) == "The model `gpt-4` does not exist"
    path = {"type": "error", "error": {"type": "not_found_error", "message": "Not Found"}}  # a wrong URL
    assert model_not_found("anthropic", 404, path) is None and model_not_found("anthropic", 400, anthropic) is None
    assert model_not_found("openai", 404, {"error": {"message": "no", "code": None}}) is None
    assert model_not_found("openai", 404, "<html>404</html>") is None


@pytest.mark.fast
def test_the_line_names_the_model_the_api_and_the_models_the_config_allows_and_never_a_key():
    allowed = {m: prices.price_of("anthropic", m, None, None, "agent.options") for m in ("claude-sonnet-5", PAPER)}
    upstream = Upstream("https://api.anthropic.com", KEY, models=allowed)
    with MeteringProxy({"anthropic": upstream}, "run-token", meter=None) as proxy:
        assert metering.model_not_found(proxy) is None
        proxy.missing_model = MissingModel("anthropic", PAPER, upstream.base_url, f"model: {PAPER} (for {KEY}).")
        error = metering.model_not_found(proxy)
    assert str(error) == (f"the anthropic API at https://api.anthropic.com has no model '{PAPER}' (it answered 404: "
                          f"model: {PAPER} (for ***)); anthropic retired it on 2025-10-22. The config allows "
                          f"{PAPER}, claude-sonnet-5 there: set a model it serves with agent.options.model=NAME")  # fmt: skip


# ---- through `python -m mlrb`, at the plumbing scale ---------------------------------------------
# A stand-in for Claude Code's and Codex's binaries: prints the arguments it was given, one a line.
STAND_IN = "#!/bin/sh\nprintf '%s\\n' \"$@\"\n"


@pytest.mark.integration
@pytest.mark.parametrize(("agent", "flag", "model"), [("claude_code", "--model", "claude-opus-4-8"),
                                                      ("codex", "-m", "gpt-5.4-mini")])  # fmt: skip
def test_agent_options_model_reaches_the_program_s_command_line_in_its_sandbox(tmp_path, plumbing_cache, agent,
                                                                               flag, model):  # fmt: skip
    """The config's own command, run in the bwrap sandbox with a stand-in binary in place of the
    installed one: it is handed agent.options.model."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("claude", "codex"):
        (tools / name).write_text(STAND_IN)
        (tools / name).chmod(0o755)
    key = "ANTHROPIC_API_KEY" if agent == "claude_code" else "OPENAI_API_KEY"
    result = run_cli(*store_args(tmp_path, plumbing_cache), PLUMBING, f"agent={agent}", f"agent.options.model={model}",
                     "agent.options.install=null", f"+agent.options.program_dir={tools}",
                     f"+agent.options.environment.PATH={tools}:$PATH", cwd=tmp_path, env={key: KEY})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    arguments = (tmp_path / "run" / "agent" / "stdout.txt").read_text().splitlines()
    assert arguments[arguments.index(flag) + 1] == model


def ends_in_one_line(result, upstream: str, model: str, said: str, allowed: str) -> None:
    """The run failed (exit status 1) with one line naming the model, the API, what it said, and
    the models the config allows; no traceback on the console."""
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stdout + result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("mlrb: run failed (") and (
        f"ModelNotFound: the {upstream} has no model '{model}' ({said}" in line
    ), line
    assert f"The config allows {allowed} there: set a model it serves with agent.options.model=NAME" in line


def recorded_as_a_config_failure(tmp_path, model: str) -> None:
    """The run is recorded as an infrastructure error (not the agent's: kept out of every mean),
    its error naming the model."""
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["mlrb.status"] == "infra_error"
    assert "ModelNotFound" in run.data.tags["mlrb.error"] and model in run.data.tags["mlrb.error"]


@pytest.mark.integration
def test_the_built_in_agent_asking_for_a_retired_model_ends_the_run_in_one_line(tmp_path, plumbing_cache):
    """agent=claude with the paper's model, which Anthropic's API no longer has: its first call is
    answered 404 not_found_error, and the run ends as a configuration error, not retried."""
    with FakeLlmServer([], models=["claude-sonnet-5"]) as server:
        result = run_cli(*store_args(tmp_path, plumbing_cache), PLUMBING, "agent=claude",
                         f"agent.options.model={PAPER}", cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    ends_in_one_line(result, f"anthropic API at {server.anthropic_url}", PAPER,
                     f"it answered 404: model: {PAPER}); anthropic retired it on 2025-10-22", PAPER)  # fmt: skip
    assert len(server.requests) == 1
    recorded_as_a_config_failure(tmp_path, PAPER)


# A program of one's own on OpenAI's API: it asks for its model twice, then gives up.
TWICE = """
import os, openai
client = openai.OpenAI(max_retries=0)
for attempt in range(2):
    try:
        client.chat.completions.create(model=os.environ["MLRB_MODEL"], messages=[{"role": "user", "content": "Hi"}])
    except openai.NotFoundError as e:
        print("not found:", e.code)
raise SystemExit(1)
"""


@pytest.mark.integration
def test_a_command_agent_s_model_the_provider_lacks_ends_the_run_in_one_line(tmp_path, plumbing_cache):
    """agent=command on OpenAI, its model one the API does not serve: the program is answered
    404 model_not_found (its second try by the proxy, which sends nothing more upstream), and the
    run ends as a configuration error, not the program's."""
    model = "gpt-4o-2024-05-13"
    with FakeLlmServer([], models=["gpt-5"]) as server:
        result = run_cli(*store_args(tmp_path, plumbing_cache), PLUMBING, "agent=command", command_override(TWICE),
                         f"agent.options.model={model}", cwd=tmp_path,
                         env={"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": server.openai_url, "ANTHROPIC_API_KEY": ""})  # fmt: skip
    ends_in_one_line(result, f"openai API at {server.openai_url}", model,
                     f"it answered 404: The model `{model}` does not exist or you do not have access to it)",
                     f"{model}, gpt-5")  # fmt: skip
    assert len(server.requests) == 1
    transcript = (tmp_path / "run" / "agent" / "stdout.txt").read_text()
    assert transcript.count("not found: model_not_found") == 2
    recorded_as_a_config_failure(tmp_path, model)


@pytest.mark.integration
def test_a_sweep_over_models_charges_each_run_its_own_model_s_price(tmp_path, plumbing_cache):
    """`-m agent.options.model=...`: each run's calls are charged at its model's price, and its
    dollar budget is spent at that price."""
    models = {"claude-sonnet-5": (2.0, 10.0), "claude-opus-4-8": (5.0, 25.0)}
    script = [reply(tool("submit", summary="done"), usage=(10_000, 1_000)) for _ in models]
    with FakeLlmServer(script, models=list(models)) as server:
        result = run_cli("-m", PLUMBING, "agent=claude", f"agent.options.model={','.join(models)}",
                         *sweep_args(tmp_path, plumbing_cache), cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    _, _, children = runs_by_role(tmp_path)
    charged = {r.data.params["agent.options.model"]: r.data.metrics["cost_usd"] for r in children}
    assert charged == {model: pytest.approx((10_000 * i + 1_000 * o) / 1e6) for model, (i, o) in models.items()}
    assert {r.data.tags["mlrb.models_used"] for r in children} == set(models)


# Claude Code and Codex, the real binaries, each given a model its stand-in API does not serve.
NOT_SERVED = {
    "claude_code": ("anthropic", PAPER, ["claude-sonnet-5", "claude-haiku-4-5"], f"model: {PAPER})",
                    f"{PAPER}, claude-haiku-4-5"),
    "codex": ("openai", "gpt-4o-2024-05-13", ["gpt-5"],
              "The model `gpt-4o-2024-05-13` does not exist or you do not have access to it)", "gpt-4o-2024-05-13"),
}  # fmt: skip


@pytest.mark.system
@pytest.mark.parametrize("agent", sorted(NOT_SERVED))
def test_claude_code_or_codex_given_a_model_the_provider_lacks_ends_the_run_in_one_line(tmp_path, plumbing_cache,
                                                                                        agent):  # fmt: skip
    """Each prints the API's answer and stops; the run ends as a configuration error, in one line."""
    provider, model, served, said, allowed = NOT_SERVED[agent]
    with FakeLlmServer([], models=served) as server:
        url = server.anthropic_url if provider == "anthropic" else server.openai_url
        env = {f"{provider.upper()}_API_KEY": KEY, f"{provider.upper()}_BASE_URL": url}
        result = run_cli(*store_args(tmp_path, plumbing_cache), PLUMBING, f"agent={agent}",
                         f"agent.options.model={model}", cwd=tmp_path, env=env)  # fmt: skip
    ends_in_one_line(result, f"{provider} API at {url}", model, f"it answered 404: {said}", allowed)
    assert [r["body"]["model"] for r in server.requests] == [model]  # asked once, not retried
    recorded_as_a_config_failure(tmp_path, model)
