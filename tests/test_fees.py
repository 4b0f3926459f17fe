"""Fees beside tokens (mlrb/models/request_rules.py says which tools bring them, mlrb/models/api_shapes.py
reads them, mlrb/models/prices.py prices them): where a task allows the network and a provider runs web
searches for a call, each search is charged at the table's (or the config's) rate, shown apart from the
tokens; a tool the provider bills at a rate the run cannot price is refused, never free.

The official SDKs, through the real metering proxy, to the scripted model server (tests/fake_llm_server.py)."""

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
from mlrb.models.api_shapes import tokens_of
from mlrb.models.proxy import Call, MeteringProxy, Upstream
from mlrb.run_files.trajectory import Trajectory, TrajectoryWriter

pytestmark = pytest.mark.fast

TOKEN = "mlrb-run-token-fees"
MODELS = {"anthropic": "claude-sonnet-5", "openai": "gpt-5"}  # $10 per 1,000 web searches in the table
SEARCH_TOOL = {"anthropic": {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
               "openai": {"type": "web_search"}}  # fmt: skip


def proxy_for(server: FakeLlmServer, meter: Budget, calls: list[Call], network: bool = True,
              price: prices.Price | None = None) -> MeteringProxy:  # fmt: skip
    """The proxy before SERVER, each provider's default model at the table's price (or PRICE), its calls
    charged to METER and kept in CALLS."""
    upstreams = {provider: Upstream(server.anthropic_url if provider == "anthropic" else server.openai_url,
                                    f"sk-{provider}-real-key-fees",
                                    models={model: price or prices.price_of(provider, model, None, None, "agent.options")})
                 for provider, model in MODELS.items()}  # fmt: skip
    proxy = MeteringProxy(upstreams, TOKEN, meter, retry_base_delay_s=0.01, network_allowed=network)
    return proxy


def attach(proxy: MeteringProxy, meter: Budget, sink: events.EventSink, calls: list[Call]) -> None:
    metering.attach(proxy, meter, sink)
    emit = proxy.on_call
    proxy.on_call = lambda call: (calls.append(call), emit(call))


def budget() -> Budget:
    return Budget(BudgetConfig(name="test", wall_time_s=600, max_steps=100))


def search_call(
    proxy: MeteringProxy, api: str, stream: bool = False, tools: list[dict[str, Any]] | None = None
) -> None:
    provider = "anthropic" if api == "anthropic" else "openai"
    tools = tools if tools is not None else [SEARCH_TOOL[provider]]
    if api == "anthropic":
        claude = anthropic.Anthropic(api_key=TOKEN, base_url=proxy.base_url("anthropic"), max_retries=0)
        if stream:
            with claude.messages.stream(model=MODELS[provider], max_tokens=100, tools=tools,
                                        messages=[{"role": "user", "content": "Look it up."}]) as answer:  # fmt: skip
                answer.get_final_message()
            return
        claude.messages.create(model=MODELS[provider], max_tokens=100, tools=tools,
                               messages=[{"role": "user", "content": "Look it up."}])  # fmt: skip
        return
    gpt = openai.OpenAI(api_key=TOKEN, base_url=proxy.base_url("openai"), max_retries=0)
    if api == "chat":
        gpt.chat.completions.create(model=MODELS[provider], messages=[{"role": "user", "content": "Look it up."}],
                                    **({"web_search_options": {}} if tools else {}))  # fmt: skip
        return
    if stream:
        list(gpt.responses.create(model=MODELS[provider], input="Look it up.", tools=tools, stream=True))
        return
    gpt.responses.create(model=MODELS[provider], input="Look it up.", tools=tools)


# Three searches Anthropic ran (its usage says so), two OpenAI's Responses ran (its web_search_call items).
SEARCHED = {
    "anthropic": reply(text="Found.", usage={"input_tokens": 5000, "output_tokens": 200,
                                             "server_tool_use": {"web_search_requests": 3}}),
    "responses": reply(text="Found.", usage=(5000, 200), searches=2),
}  # fmt: skip
SEARCHES = {"anthropic": 3, "responses": 2}


@pytest.mark.parametrize("api", SEARCHED)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_each_web_search_the_provider_ran_is_charged_at_the_table_s_rate_as_its_own_line(api, stream, tmp_path):
    provider = "anthropic" if api == "anthropic" else "openai"
    calls: list[Call] = []
    meter = budget()
    trajectory = tmp_path / "trajectory.jsonl"
    with FakeLlmServer([SEARCHED[api]]) as server, proxy_for(server, meter, calls) as proxy:
        attach(proxy, meter, events.EventSink([TrajectoryWriter(Trajectory(trajectory))]), calls)
        search_call(proxy, api, stream)
    [call] = calls
    searches = SEARCHES[api]
    billed = genai_prices.calc_price(genai_prices.Usage(input_tokens=5000, output_tokens=200, web_searches=searches),
                                     MODELS[provider], provider_id=provider)  # fmt: skip
    assert call.usage.web_searches == searches and not call.estimated
    assert call.charge.fee_usd == pytest.approx(searches * 10 / 1000)  # $10 per 1,000 searches
    assert call.usd == pytest.approx(float(billed.total_price), rel=1e-12)
    assert call.usd == pytest.approx(call.charge.input_usd + call.charge.output_usd + searches * 0.01)
    assert (meter.web_searches, meter.fee_usd) == (searches, pytest.approx(searches * 0.01))
    assert meter.usd == pytest.approx(call.usd)
    [line] = [x for x in map(json.loads, trajectory.read_text().splitlines()) if x["event"] == "model_call"]
    assert (line["web_searches"], line["fee_usd"]) == (searches, pytest.approx(searches * 0.01))
    assert line["cost_usd"] == pytest.approx(call.usd, abs=1e-8)


def test_a_search_is_refused_where_the_model_s_price_has_no_rate_for_it_and_charged_where_the_config_sets_one():
    """A model priced by the config alone (a local server's, say) has no rate for a search: a call that
    offers the provider's web search would be served and not charged for it, so it is refused, and
    nothing goes upstream. With agent.options.price_per_1k_web_searches set, it goes, and is charged."""
    no_rate = prices.price_of("anthropic", MODELS["anthropic"], 2.0, 10.0, "agent.options")
    calls: list[Call] = []
    with FakeLlmServer([SEARCHED["anthropic"]]) as server, proxy_for(server, budget(), calls, price=no_rate) as proxy:
        attach(proxy, budget(), events.EventSink([]), calls)
        with pytest.raises(
            anthropic.BadRequestError, match="billed beside the call's tokens.*price_per_1k_web_searches"
        ):
            search_call(proxy, "anthropic")
        assert server.requests == [] and [(c.status, c.attempts) for c in calls] == [(400, 0)]
    rated = prices.price_of("anthropic", MODELS["anthropic"], 2.0, 10.0, "agent.options", per_1k_web_searches=25.0)
    calls = []
    with FakeLlmServer([SEARCHED["anthropic"]]) as server, proxy_for(server, budget(), calls, price=rated) as proxy:
        attach(proxy, budget(), events.EventSink([]), calls)
        search_call(proxy, "anthropic")
    assert calls[0].usd == pytest.approx((5000 * 2 + 200 * 10) / 1e6 + 3 * 0.025)


UNPRICEABLE = {  # (api, tools): what the provider bills beside tokens at a rate the run cannot price
    "anthropic code_execution": ("anthropic", [{"type": "code_execution_20250825", "name": "code_execution"}]),
    "responses code_interpreter": ("responses", [{"type": "code_interpreter", "container": {"type": "auto"}}]),
    "responses file_search": ("responses", [{"type": "file_search", "vector_store_ids": ["vs_1"]}]),
    "responses a hosted shell": ("responses", [{"type": "shell", "environment": {"type": "container_auto"}}]),
    "chat web_search_options": ("chat", [{"type": "web_search_options"}]),
}  # fmt: skip


@pytest.mark.parametrize("case", UNPRICEABLE)
def test_a_tool_billed_at_a_rate_the_run_cannot_price_is_refused_even_with_the_network(case):
    """A code container's hours, stored files, Chat Completions' searches (billed per call by their
    context size, which no usage says): refused before anything goes upstream, never free."""
    api, tools = UNPRICEABLE[case]
    calls: list[Call] = []
    with FakeLlmServer([reply(text="ran it", usage=(10, 5))]) as server, \
            proxy_for(server, budget(), calls, network=True) as proxy:  # fmt: skip
        attach(proxy, budget(), events.EventSink([]), calls)
        error = anthropic.BadRequestError if api == "anthropic" else openai.BadRequestError
        with pytest.raises(error, match="billed beside the call's tokens at a rate the run's budget does not price"):
            search_call(proxy, api, tools=tools)
    assert server.requests == [] and [(c.status, c.attempts) for c in calls] == [(400, 0)]


def test_a_search_count_that_cannot_be_true_makes_no_usage_and_the_call_an_estimate():
    usage = {"input_tokens": 10, "output_tokens": 5, "server_tool_use": {"web_search_requests": -3}}
    assert tokens_of(usage) is None
    assert tokens_of({**usage, "server_tool_use": {"web_search_requests": "3"}}) is None
    assert tokens_of({**usage, "server_tool_use": {"web_search_requests": 3}}).web_searches == 3
