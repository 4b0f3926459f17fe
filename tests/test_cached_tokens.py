"""Each kind of token at its own rate (mlrb/models/api_shapes.py reads it, mlrb/models/prices.py prices
it, mlrb/models/proxy.py charges it): a prompt read from the provider's cache costs the table's
cache-read rate, one written to it the cache-write rate of its lifetime, not the input rate; the
run's record keeps each kind apart.

Each call is an official SDK's, through the real metering proxy, to the scripted model server
(tests/fake_llm_server.py) reporting the usage as each API does. What it must cost is asked of
genai-prices itself (its public `calc_price`, the provider's bill), given the usage as the
provider reported it."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import genai_prices
import openai
import pytest

from fake_llm_server import FakeLlmServer, reply
from mlrb.core import events
from mlrb.core.budget import Budget
from mlrb.core.config import BudgetConfig
from mlrb.models import metering, prices
from mlrb.models.proxy import Call, MeteringProxy, Upstream
from mlrb.run_files.trajectory import Trajectory, TrajectoryWriter

pytestmark = pytest.mark.fast

TOKEN = "mlrb-run-token-cached"
MODELS = {"anthropic": "claude-sonnet-5", "openai": "gpt-5"}  # the configs' defaults, priced by the table

# One call's usage per API, as the API reports it: a prompt of 203,100 tokens, 200,000 of them read from
# the cache and (Anthropic, which bills writes) 3,000 written to it, 1,000 for five minutes and 2,000 for
# an hour; 100 output tokens.
USAGE = {
    "anthropic": {"input_tokens": 100, "cache_read_input_tokens": 200_000, "cache_creation_input_tokens": 3000,
                  "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
                  "output_tokens": 100},
    "chat": {"prompt_tokens": 203_100, "completion_tokens": 100, "total_tokens": 203_200,
             "prompt_tokens_details": {"cached_tokens": 200_000, "audio_tokens": 0},
             "completion_tokens_details": {"reasoning_tokens": 0}},
    "responses": {"input_tokens": 203_100, "output_tokens": 100, "total_tokens": 203_200,
                  "input_tokens_details": {"cached_tokens": 200_000}, "output_tokens_details": {"reasoning_tokens": 0}},
}  # fmt: skip
# The same usage in genai-prices' terms: input_tokens is the whole prompt, the cache's tokens parts of it.
TABLE_USAGE = {
    "anthropic": dict(input_tokens=203_100, cache_read_tokens=200_000, cache_write_tokens=3000,
                      cache_write_1h_tokens=2000, output_tokens=100),
    "chat": dict(input_tokens=203_100, cache_read_tokens=200_000, output_tokens=100),
    "responses": dict(input_tokens=203_100, cache_read_tokens=200_000, output_tokens=100),
}  # fmt: skip
PROVIDER = {"anthropic": "anthropic", "chat": "openai", "responses": "openai"}


def budget(**limits: Any) -> Budget:
    return Budget(BudgetConfig(name="test", wall_time_s=600, max_steps=100, **limits))


def table_usd(provider: str, **usage: int) -> float:
    """What genai-prices says a call of PROVIDER's default model that used USAGE costs."""
    return float(genai_prices.calc_price(genai_prices.Usage(**usage), MODELS[provider], provider_id=provider)
                 .total_price)  # fmt: skip


def proxy_for(server: FakeLlmServer, meter: Budget, calls: list[Call], **rates: float) -> MeteringProxy:
    """The proxy before SERVER, each provider's default model at the table's price (RATES, the
    config's, over it: prices.CONFIG_RATES' keys)."""
    upstreams = {provider: Upstream(server.anthropic_url if provider == "anthropic" else server.openai_url,
                                    f"sk-{provider}-real-key-cached",
                                    models={model: prices.price_of(provider, model, rates.get("input_per_mtok"),
                                                                   rates.get("output_per_mtok"), "agent.options",
                                                                   **{k: v for k, v in rates.items()
                                                                      if not k.startswith(("input", "output"))})})
                 for provider, model in MODELS.items()}  # fmt: skip
    return MeteringProxy(upstreams, TOKEN, meter, on_call=calls.append, retry_base_delay_s=0.01)


def attach(proxy: MeteringProxy, meter: Budget, sink: events.EventSink, calls: list[Call]) -> None:
    """The run's metering (the budget charged, each call an event in SINK), the calls kept in CALLS too."""
    metering.attach(proxy, meter, sink)
    emit = proxy.on_call
    proxy.on_call = lambda call: (calls.append(call), emit(call))


def sdk_call(proxy: MeteringProxy, api: str, stream: bool) -> Any:
    """One call of API by its official SDK through the proxy; the usage the SDK read."""
    if api == "anthropic":
        claude = anthropic.Anthropic(api_key=TOKEN, base_url=proxy.base_url("anthropic"), max_retries=0)
        if stream:
            with claude.messages.stream(model=MODELS["anthropic"], max_tokens=100,
                                        messages=[{"role": "user", "content": "Go on."}]) as events_:  # fmt: skip
                return events_.get_final_message().usage
        return claude.messages.create(model=MODELS["anthropic"], max_tokens=100,
                                      messages=[{"role": "user", "content": "Go on."}]).usage  # fmt: skip
    gpt = openai.OpenAI(api_key=TOKEN, base_url=proxy.base_url("openai"), max_retries=0)
    if api == "chat":
        if stream:
            chunks = list(gpt.chat.completions.create(model=MODELS["openai"], stream=True,
                                                      messages=[{"role": "user", "content": "Go on."}]))  # fmt: skip
            return chunks[-1].usage
        return gpt.chat.completions.create(
            model=MODELS["openai"], messages=[{"role": "user", "content": "Go on."}]
        ).usage
    if stream:
        done = [e for e in gpt.responses.create(model=MODELS["openai"], input="Go on.", stream=True)
                if e.type == "response.completed"]  # fmt: skip
        return done[-1].response.usage
    return gpt.responses.create(model=MODELS["openai"], input="Go on.").usage


@pytest.mark.parametrize("api", USAGE)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_cached_prompt_is_charged_what_the_table_says_for_each_kind_of_token(api, stream, tmp_path):
    """Through the real proxy, the SDK's call is charged exactly what genai-prices computes for the usage
    the provider reported, and the budget and the trajectory's model_call line keep each kind apart."""
    provider = PROVIDER[api]
    calls: list[Call] = []
    meter = budget()
    trajectory = tmp_path / "trajectory.jsonl"
    sink = events.EventSink([TrajectoryWriter(Trajectory(trajectory))])
    with FakeLlmServer([reply(text="Done.", usage=USAGE[api])]) as server, proxy_for(server, meter, calls) as proxy:
        attach(proxy, meter, sink, calls)
        seen = sdk_call(proxy, api, stream)
    assert seen is not None and seen.model_dump()["output_tokens" if api != "chat" else "completion_tokens"] == 100
    [call] = calls
    usage = TABLE_USAGE[api]
    billed = table_usd(provider, **usage)
    assert (call.status, call.estimated) == (200, False)
    assert call.usd == pytest.approx(billed, rel=1e-12) and meter.usd == pytest.approx(billed, rel=1e-12)
    plain = table_usd(provider, input_tokens=usage["input_tokens"], output_tokens=100)  # every token as plain input
    assert call.usd < plain / 5, (call.usd, plain)  # a cache read costs a tenth of an input token, or less
    assert (meter.input_tokens, meter.output_tokens, meter.cache_read_tokens, meter.cache_write_tokens) == (
        203_100,
        100,
        200_000,
        usage.get("cache_write_tokens", 0),
    )
    assert meter.held.usd == 0 and meter.in_flight == 0  # the reservation was released, the usage settled
    [line] = [json.loads(x) for x in trajectory.read_text().splitlines() if json.loads(x)["event"] == "model_call"]
    assert {k: line[k] for k in ("input_tokens", "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens",
                                 "output_tokens")} == {  # fmt: skip
        "input_tokens": 203_100, "cache_read_tokens": 200_000, "cache_write_tokens": usage.get("cache_write_tokens", 0),
        "cache_write_1h_tokens": usage.get("cache_write_1h_tokens", 0), "output_tokens": 100}  # fmt: skip
    assert line["cost_usd"] == pytest.approx(billed, abs=1e-8)


def test_the_issues_call_200k_tokens_read_from_the_cache_cost_a_tenth_of_plain_input():
    """200,000 cache-read tokens, 100 input and 100 output at Claude Sonnet 5's prices: $0.0412 (the
    cache-read rate, $0.20 per million), not the $0.4012 that plain input would cost."""
    calls: list[Call] = []
    meter = budget()
    usage = {"input_tokens": 100, "cache_read_input_tokens": 200_000, "output_tokens": 100}
    with FakeLlmServer([reply(text="Done.", usage=usage)]) as server, proxy_for(server, meter, calls) as proxy:
        attach(proxy, meter, events.EventSink([]), calls)
        sdk_call(proxy, "anthropic", stream=False)
    assert calls[0].usd == pytest.approx((200_000 * 0.2 + 100 * 2 + 100 * 10) / 1e6)  # 0.0412
    assert calls[0].usd == pytest.approx(table_usd("anthropic", input_tokens=200_100, cache_read_tokens=200_000,
                                                   output_tokens=100))  # fmt: skip
    assert calls[0].charge.input_usd == pytest.approx(0.0402) and calls[0].charge.output_usd == pytest.approx(0.001)


def test_a_config_rate_overrides_the_table_s_rate_it_names_and_no_other(tmp_path):
    """agent.options.price_cache_read_per_mtok (here $1 per million, five times the table's) prices the
    cache reads; the table's rates price the rest, its one-hour writes included."""
    calls: list[Call] = []
    meter = budget()
    with FakeLlmServer([reply(text="Done.", usage=USAGE["anthropic"])]) as server, \
            proxy_for(server, meter, calls, cache_read_per_mtok=1.0) as proxy:  # fmt: skip
        attach(proxy, meter, events.EventSink([]), calls)
        sdk_call(proxy, "anthropic", stream=False)
    # Sonnet 5 in the table: $2 input, $10 output, $2.50 five-minute and $4 one-hour writes per million.
    assert calls[0].usd == pytest.approx((100 * 2 + 200_000 * 1.0 + 1000 * 2.5 + 2000 * 4 + 100 * 10) / 1e6)
    assert "agent.options.price_cache_read_per_mtok, the rest from genai-prices" in calls[0].price.source


def test_a_price_set_whole_in_the_config_charges_a_cached_token_its_input_rate_unless_it_names_a_cache_rate():
    """A model the table does not know (a local server's), priced by the config's input and output
    rates alone: its cached tokens cost the input rate, never nothing; a cache rate it names prices them."""
    usage = prices.Usage(203_100, 100, cache_read_tokens=200_000, cache_write_tokens=3000, cache_write_1h_tokens=2000)
    alone = prices.price_of("openai", "local-llama", 1.0, 2.0, "agent.options")
    assert alone.charge(usage).usd == pytest.approx((203_100 * 1.0 + 100 * 2.0) / 1e6)
    named = prices.price_of("openai", "local-llama", 1.0, 2.0, "agent.options", cache_read_per_mtok=0.1,
                            cache_write_1h_per_mtok=5.0)  # fmt: skip
    assert named.charge(usage).usd == pytest.approx((100 + 200_000 * 0.1 + 1000 * 1.0 + 2000 * 5.0 + 100 * 2.0) / 1e6)


# Each agent with what it needs beside (a model for a local server, a program for a command agent), and
# where its rates are set.
AGENT_RATES = {
    "claude": ([], "agent.options"),
    "gpt4o": ([], "agent.options"),
    "openai_compatible": (
        ["agent.options.model=local", "agent.options.base_url=http://127.0.0.1:8000/v1"],
        "agent.options",
    ),
    "command": (["agent.options.command='python a.py'"], "agent.options.providers.anthropic"),
    "claude_code": ([], "agent.options.providers.anthropic"),
    "codex": ([], "agent.options.providers.openai"),
}


@pytest.mark.parametrize("agent", sorted(AGENT_RATES))
def test_each_rate_beside_input_and_output_is_a_key_a_user_can_set_on_the_command_line(monkeypatch, agent):
    """The pages name them as keys of each agent's options: the command line takes them, and a bad one
    is the one line that names it."""
    from mlrb.cli import check_jobs, parse_command_line
    from mlrb.core.config import ConfigError, register_schema

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-cached")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-cached")
    register_schema()
    needs, options = AGENT_RATES[agent]
    rates = [
        f"{options}.price_{key}=0.3" for key in prices.CONFIG_RATES if key not in ("input_per_mtok", "output_per_mtok")
    ]
    check_jobs(parse_command_line([f"agent={agent}", *needs, *rates]).args)
    with pytest.raises(ConfigError, match=rf"{options}\.price_cache_read_per_mtok must .*-3"):
        check_jobs(parse_command_line([f"agent={agent}", *needs, f"{options}.price_cache_read_per_mtok=-3"]).args)
