"""A call is priced at the service tier its provider served it at (mlrb/models/api_shapes.py's `tier_of`
reads it, mlrb/models/request_rules.py says which tier is billed, mlrb/models/prices.py prices it):
OpenAI's priority tier dearer than the standard one and its flex tier cheaper, Anthropic's fast mode
a multiple of the standard rate, each at genai-prices' own rates for that tier. What the agent asks
for can only cost it more: a reply that says no tier is billed at the dearer tier asked for, the
budget holds a call's likely cost at that tier, and a dearer tier the run has no price for is refused
before anything goes upstream.

Each call is an official SDK's, through the real metering proxy, to the scripted model server
(tests/fake_llm_server.py). What it must cost is asked of genai-prices itself (its public
`calc_price`, given the usage and the tier as the provider reported them)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import genai_prices
import openai
import pytest

from fake_llm_server import FakeLlmServer, reply
from mlrb.core import events
from mlrb.core.budget import Budget, Spend
from mlrb.core.config import BudgetConfig
from mlrb.models import metering, prices
from mlrb.models.proxy import Call, MeteringProxy, Upstream
from mlrb.models.request_rules import billed_tier
from mlrb.run_files.trajectory import Trajectory, TrajectoryWriter

pytestmark = pytest.mark.fast

TOKEN = "mlrb-run-token-tiers"
OPENAI_MODEL, FAST_MODEL = "gpt-5", "claude-opus-5"  # the table prices gpt-5's priority and flex, opus 5's fast mode
# One call's usage as each API reports it: a prompt of 20,000 tokens, 4,000 of them read from the cache; 1,000 out.
USAGE = {
    "chat": {"prompt_tokens": 20_000, "completion_tokens": 1000, "total_tokens": 21_000,
             "prompt_tokens_details": {"cached_tokens": 4000}},
    "responses": {"input_tokens": 20_000, "output_tokens": 1000, "total_tokens": 21_000,
                  "input_tokens_details": {"cached_tokens": 4000}, "output_tokens_details": {"reasoning_tokens": 0}},
    "anthropic": {"input_tokens": 16_000, "cache_read_input_tokens": 4000, "output_tokens": 1000},
}  # fmt: skip
TABLE_USAGE = genai_prices.Usage(input_tokens=20_000, cache_read_tokens=4000, output_tokens=1000)


class HeldBudget(Budget):
    """The run's budget, keeping what each call held while in flight."""

    def __init__(self) -> None:
        super().__init__(BudgetConfig(name="test", wall_time_s=600, max_steps=100))
        self.holds: list[Spend] = []

    def reserve(self, hold: Spend) -> str | None:
        self.holds.append(hold)
        return super().reserve(hold)


def table_usd(provider: str, model: str, tier: dict[str, str] | None = None) -> float:
    """What genai-prices says a call of MODEL that used TABLE_USAGE costs at TIER (its price context)."""
    return float(genai_prices.calc_price(TABLE_USAGE, model, provider_id=provider, price_context=tier).total_price)


def proxy_for(server: FakeLlmServer, meter: Budget, calls: list[Call], trajectory: Any = None,
              **models: prices.Price) -> MeteringProxy:  # fmt: skip
    """The proxy before SERVER, gpt-5 and claude-opus-5 at the table's prices (MODELS beside them), its
    calls charged to METER, kept in CALLS, and recorded in the trajectory at TRAJECTORY (a path) if given."""
    table = {"openai": prices.price_of("openai", OPENAI_MODEL, None, None, "agent.options"),
             "anthropic": prices.price_of("anthropic", FAST_MODEL, None, None, "agent.options")}  # fmt: skip
    upstreams = {provider: Upstream(server.anthropic_url if provider == "anthropic" else server.openai_url,
                                    f"sk-{provider}-real-key-tiers",
                                    models={price.model: price, **{m: p for m, p in models.items()
                                                                   if p.provider == provider}})
                 for provider, price in table.items()}  # fmt: skip
    proxy = MeteringProxy(upstreams, TOKEN, meter, retry_base_delay_s=0.01)
    metering.attach(proxy, meter, events.EventSink([TrajectoryWriter(Trajectory(trajectory))] if trajectory else []))
    emit = proxy.on_call
    proxy.on_call = lambda call: (calls.append(call), emit(call))
    return proxy


def model_call_line(trajectory: Any) -> dict[str, Any]:
    """The trajectory's one model_call line."""
    [line] = [json.loads(x) for x in trajectory.read_text().splitlines() if json.loads(x)["event"] == "model_call"]
    return line


def openai_call(proxy: MeteringProxy, api: str, stream: bool, model: str = OPENAI_MODEL, **extra: Any) -> None:
    """One call of API by the official OpenAI SDK through the proxy, read to its end."""
    gpt = openai.OpenAI(api_key=TOKEN, base_url=proxy.base_url("openai"), max_retries=0)
    if api == "chat":
        answer = gpt.chat.completions.create(model=model, messages=[{"role": "user", "content": "Go on."}],
                                             stream=stream, **extra)  # fmt: skip
    else:
        answer = gpt.responses.create(model=model, input="Go on.", stream=stream, **extra)
    if stream:
        list(answer)


def anthropic_call(proxy: MeteringProxy, stream: bool, model: str = FAST_MODEL, **extra: Any) -> None:
    claude = anthropic.Anthropic(api_key=TOKEN, base_url=proxy.base_url("anthropic"), max_retries=0)
    request = dict(model=model, max_tokens=1000, messages=[{"role": "user", "content": "Go on."}], **extra)
    if stream:
        with claude.messages.stream(**request) as events_:
            events_.get_final_message()
    else:
        claude.messages.create(**request)


@pytest.mark.parametrize("tier", ["priority", "flex"])
@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_openai_call_is_charged_the_table_s_rates_of_the_tier_it_was_served_at(tier, api, stream, tmp_path):
    """`service_tier: priority` (or flex) goes upstream, and the call is charged exactly what genai-prices
    computes for the usage at the tier the reply says: priority dearer than the standard rates, flex
    cheaper. The budget is charged the same, and the call's model_call line names its tier."""
    calls: list[Call] = []
    meter, trajectory = HeldBudget(), tmp_path / "trajectory.jsonl"
    with FakeLlmServer([reply(text="Done.", usage=USAGE[api], service_tier=tier)]) as server, \
            proxy_for(server, meter, calls, trajectory) as proxy:  # fmt: skip
        openai_call(proxy, api, stream, service_tier=tier)
    assert server.requests[0]["body"]["service_tier"] == tier  # the tier asked for went upstream
    [call] = calls
    billed = table_usd("openai", OPENAI_MODEL, {"service_tier": tier})
    standard = table_usd("openai", OPENAI_MODEL)
    assert (call.status, call.estimated, call.tier) == (200, False, {"service_tier": tier})
    assert call.usd == pytest.approx(billed, rel=1e-12) and meter.usd == pytest.approx(billed, rel=1e-12)
    assert billed > standard * 1.5 if tier == "priority" else billed < standard * 0.75, (billed, standard)
    line = model_call_line(trajectory)
    assert (line["tier"], line["cost_usd"]) == (tier, pytest.approx(billed, abs=1e-8))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_anthropic_fast_mode_call_is_charged_the_table_s_fast_rates(stream, tmp_path):
    """`speed: fast` on a model the table prices it for (Claude Opus 5) goes upstream, and the call the
    usage says was fast is charged genai-prices' fast rates: twice the standard ones, or more."""
    calls: list[Call] = []
    meter, trajectory = HeldBudget(), tmp_path / "trajectory.jsonl"
    with FakeLlmServer([reply(text="Done.", usage={**USAGE["anthropic"], "speed": "fast"})]) as server, \
            proxy_for(server, meter, calls, trajectory) as proxy:  # fmt: skip
        anthropic_call(proxy, stream, speed="fast")
    assert server.requests[0]["body"]["speed"] == "fast"
    [call] = calls
    billed = table_usd("anthropic", FAST_MODEL, {"speed": "fast"})
    assert call.usd == pytest.approx(billed, rel=1e-12) and meter.usd == pytest.approx(billed, rel=1e-12)
    assert billed > 1.5 * table_usd("anthropic", FAST_MODEL)
    assert model_call_line(trajectory)["tier"] == "fast"


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
def test_a_dearer_tier_asked_for_is_charged_when_the_reply_does_not_say_its_tier(api):
    """The agent asks for priority (Anthropic: fast mode) and the reply says no tier, or one the run does
    not know: the call is charged at the tier asked for, never the cheaper standard rates."""
    calls: list[Call] = []
    meter = HeldBudget()
    unknown = None if api != "responses" else "auto"  # Responses' in-progress word, not a tier served
    with FakeLlmServer([reply(text="Done.", usage=USAGE[api], service_tier=unknown)]) as server, \
            proxy_for(server, meter, calls) as proxy:  # fmt: skip
        if api == "anthropic":
            anthropic_call(proxy, stream=False, speed="fast")
        else:
            openai_call(proxy, api, stream=False, service_tier="priority")
    provider, model, tier = (("anthropic", FAST_MODEL, {"speed": "fast"}) if api == "anthropic"
                             else ("openai", OPENAI_MODEL, {"service_tier": "priority"}))  # fmt: skip
    assert calls[0].usd == pytest.approx(table_usd(provider, model, tier), rel=1e-12)
    assert calls[0].usd > 1.5 * table_usd(provider, model)


def test_the_tier_the_provider_says_it_served_is_billed_and_an_unknown_one_leaves_the_dearer_tier_asked_for():
    """The provider's word is the bill (OpenAI serves a priority call at the default tier past its
    limits); a word the run does not know, or none, bills the tier asked for when it costs more than
    the standard one, else the standard one (flex asked for, nothing said: the dearer standard rates)."""
    priority, flex = {"service_tier": "priority"}, {"service_tier": "flex"}
    assert billed_tier("openai", priority, {"service_tier": "default"}) == {}
    assert billed_tier("openai", {}, {"service_tier": "priority"}) == priority  # a project whose default is priority
    assert billed_tier("openai", priority, {"service_tier": "scale"}) == priority
    assert billed_tier("openai", priority, {}) == priority
    assert billed_tier("openai", flex, {}) == {}
    assert billed_tier("openai", flex, {"service_tier": "flex"}) == flex
    assert billed_tier("anthropic", {"speed": "fast"}, {"service_tier": "standard"}) == {"speed": "fast"}
    assert billed_tier("anthropic", {"speed": "fast"}, {"speed": "standard"}) == {}


UNPRICED = {  # (api, model, the request's tier, what the refusal must say)
    "gpt-5-nano priority (the table has no priority rates for it)": (
        "chat", "gpt-5-nano", {"service_tier": "priority"},
        "`service_tier: 'priority'` is billed at a rate the run has no price for with model 'gpt-5-nano'"
        " (the price table has none for it, or the agent's options set the model's prices); "
        "valid: 'auto', 'default', 'flex'"),
    "a model the config prices, priority": (
        "responses", "gpt-5-configured", {"service_tier": "priority"},
        "with model 'gpt-5-configured' (the price table has none for it, or the agent's options set the model's "
        "prices); valid: 'auto', 'default', 'flex'"),
    "openai scale": ("chat", OPENAI_MODEL, {"service_tier": "scale"},
                     "`service_tier: 'scale'` is billed at a rate the run's budget does not price "
                     "(valid: 'auto', 'default', 'flex', 'priority', 'fast')"),
    "claude-sonnet-5 fast mode (the table has no fast rates for it)": (
        "anthropic", "claude-sonnet-5", {"speed": "fast"},
        "`speed: 'fast'` is billed at a rate the run has no price for with model 'claude-sonnet-5'"),
    "anthropic a pinned region": ("anthropic", FAST_MODEL, {"inference_geo": "us"},
                                  "`inference_geo: 'us'` is billed at a rate the run's budget does not price "
                                  "(valid: 'global')"),
}  # fmt: skip


@pytest.mark.parametrize("case", UNPRICED)
def test_a_tier_the_run_cannot_price_is_refused_before_it_goes_upstream_in_one_sentence(case):
    """A dearer tier the model's price has no rates for (the table has none, or the config sets the
    model's prices), or a tier no price has, is refused before anything goes upstream: one sentence
    naming the field, the value and the values the model allows."""
    api, model, tier, said = UNPRICED[case]
    calls: list[Call] = []
    extra = {"gpt-5-nano": prices.price_of("openai", "gpt-5-nano", None, None, "agent.options"),
             "gpt-5-configured": prices.price_of("openai", "gpt-5-configured", 1.25, 10.0, "agent.options"),
             "claude-sonnet-5": prices.price_of("anthropic", "claude-sonnet-5", None, None, "agent.options")}  # fmt: skip
    with FakeLlmServer([reply(text="served")]) as server, proxy_for(server, HeldBudget(), calls, **extra) as proxy:
        error = anthropic.BadRequestError if api == "anthropic" else openai.BadRequestError
        with pytest.raises(error) as refused:
            if api == "anthropic":
                anthropic_call(proxy, stream=False, model=model, **tier)
            else:
                openai_call(proxy, api, stream=False, model=model, **tier)
    assert server.requests == []
    assert [(c.status, c.attempts) for c in calls] == [(400, 0)]
    assert said in calls[0].refused and said in str(refused.value)


def test_the_budget_holds_a_priority_call_s_likely_cost_at_priority_rates():
    """While a call is in flight the budget holds its likely cost: for a priority call, its prompt and
    the most it may write at the priority rates, so calls at once cannot overrun the budget at the
    standard ones. A flex call is held at the standard rates (the dearer, when the reply says no tier)."""
    calls: list[Call] = []
    meter = HeldBudget()
    usage = USAGE["chat"]
    with FakeLlmServer([reply(text="Done.", usage=usage, service_tier=t) for t in ("priority", "flex")]) as server, \
            proxy_for(server, meter, calls) as proxy:  # fmt: skip
        openai_call(proxy, "chat", stream=False, service_tier="priority", max_tokens=5000)
        openai_call(proxy, "chat", stream=False, service_tier="flex", max_tokens=5000)
    price = prices.price_of("openai", OPENAI_MODEL, None, None, "agent.options")
    priority_hold, flex_hold = meter.holds
    assert priority_hold.output_tokens == 5000
    tokens = (priority_hold.input_tokens, priority_hold.output_tokens)
    assert priority_hold.usd == pytest.approx(price.usd(*tokens, {"service_tier": "priority"}), rel=1e-12)
    assert priority_hold.usd > 1.5 * price.usd(*tokens)
    assert flex_hold.usd == pytest.approx(price.usd(flex_hold.input_tokens, flex_hold.output_tokens), rel=1e-12)
