"""The metering proxy fails closed (mlrb/models/proxy.py): every call the upstream served is charged,
whatever the agent does with its connection; calls made at once cannot spend the budget many
times over; only the models the run's config allows go upstream, each at its own price.

Each test is an agent's cheapest way around the meter, played against the real proxy and a
scripted upstream (tests/fake_llm_server.py): the official SDKs, or raw HTTP where the agent
hangs up half-way."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import anthropic
import openai
import pytest
import yaml

from conftest import REPO
from fake_llm_server import FakeLlmServer, reply, tool
from mlrb.agents.command import CommandAgent
from mlrb.agents.llm import LlmAgent
from mlrb.agents.recording import open_sink
from mlrb.core.budget import Budget
from mlrb.core.config import AgentConfig, BudgetConfig
from mlrb.models import metering
from mlrb.models.proxy import Call, MeteringProxy, Upstream

pytestmark = pytest.mark.fast

TOKEN = "mlrb-run-token-5678"
ANTHROPIC_KEY, OPENAI_KEY = "sk-ant-real-key-charging", "sk-openai-real-key-charging"
KEY_ENV = "MLRB_TEST_CHARGING_KEY"
ANSWER = "The answer is 42."
BIG_PROMPT = 250_000  # input tokens the upstream reports for each call here
PRICES = {"anthropic": (3.0, 15.0), "openai": (2.5, 10.0)}  # USD per million tokens (input, output)


def budget(**limits: Any) -> Budget:
    return Budget(BudgetConfig(name="test", wall_time_s=600, max_steps=100, **limits))


def usd(provider: str, input_tokens: int, output_tokens: int) -> float:
    price_in, price_out = PRICES[provider]
    return (input_tokens * price_in + output_tokens * price_out) / 1e6


def proxy_for(server: FakeLlmServer, meter: Budget, calls: list[Call]) -> MeteringProxy:
    upstreams = {"anthropic": Upstream(server.anthropic_url, ANTHROPIC_KEY, *PRICES["anthropic"]),
                 "openai": Upstream(server.openai_url, OPENAI_KEY, *PRICES["openai"])}  # fmt: skip
    return MeteringProxy(upstreams, TOKEN, meter, on_call=calls.append, retry_base_delay_s=0.01)


# What each API's agent sends, raw: (the proxy's path, the key's header, the request's body).
RAW = {
    "anthropic": ("/anthropic/v1/messages", {"x-api-key": TOKEN, "anthropic-version": "2023-06-01"},
                  {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "Solve."}]}),
    "openai chat": ("/openai/v1/chat/completions", {"authorization": f"Bearer {TOKEN}"},
                    {"model": "m", "messages": [{"role": "user", "content": "Solve."}]}),
    "openai responses": ("/openai/v1/responses", {"authorization": f"Bearer {TOKEN}"},
                         {"model": "m", "input": "Solve."}),
}  # fmt: skip


def send(proxy: MeteringProxy, api: str, stream: bool) -> http.client.HTTPConnection:
    """An agent's call as raw HTTP; the connection, its answer not read yet."""
    path, headers, body = RAW[api]
    connection = http.client.HTTPConnection(urlsplit(proxy.url).netloc, timeout=10)
    connection.request("POST", path, body=json.dumps({**body, "stream": stream}),
                       headers={"content-type": "application/json", **headers})  # fmt: skip
    return connection


def hang_up(connection: http.client.HTTPConnection, response: http.client.HTTPResponse | None = None) -> None:
    """Close the connection at once, with a reset: the proxy's next write to it fails."""
    assert connection.sock is not None
    connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if response is not None:
        response.close()
    connection.close()


def reported(calls: list[Call], n: int = 1, within_s: float = 10.0) -> list[Call]:
    """The proxy's calls once N are reported (it reads on after the agent has gone)."""
    deadline = time.monotonic() + within_s
    while len(calls) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return calls


@pytest.mark.parametrize("api", RAW)
def test_a_stream_the_agent_hangs_up_on_once_its_answer_is_in_is_charged_the_upstream_s_usage(api):
    """The agent reads until the answer's text is complete, then hangs up before the events that
    carry the usage and the end: the proxy reads the upstream's reply on to its end and charges it."""
    provider = api.split()[0]
    calls: list[Call] = []
    meter = budget()
    with FakeLlmServer([reply(text=ANSWER, usage=(BIG_PROMPT, 300), end_after_s=0.5)]) as server:
        with proxy_for(server, meter, calls) as proxy:
            connection = send(proxy, api, stream=True)
            response = connection.getresponse()
            seen = b""
            while ANSWER.encode() not in seen:
                chunk = response.read1(65536)
                assert chunk, f"the stream ended before the answer: {seen[-500:]!r}"
                seen += chunk
            hang_up(connection, response)
            [call] = reported(calls)
    assert (call.status, call.input_tokens, call.output_tokens, call.estimated) == (200, BIG_PROMPT, 300, False)
    assert call.usd == pytest.approx(usd(provider, BIG_PROMPT, 300))
    assert (meter.input_tokens, meter.output_tokens) == (BIG_PROMPT, 300)
    assert meter.usd == pytest.approx(usd(provider, BIG_PROMPT, 300)) and meter.held.usd == 0


@pytest.mark.parametrize("api", RAW)
def test_a_whole_reply_the_agent_hangs_up_on_before_it_comes_is_charged(api):
    provider = api.split()[0]
    calls: list[Call] = []
    meter = budget()
    with FakeLlmServer([reply(text=ANSWER, usage=(BIG_PROMPT, 300), delay_s=0.5)]) as server:
        with proxy_for(server, meter, calls) as proxy:
            connection = send(proxy, api, stream=False)
            deadline = time.monotonic() + 10
            while not server.requests and time.monotonic() < deadline:  # upstream has it: it will be served
                time.sleep(0.01)
            hang_up(connection)
            [call] = reported(calls)
    assert (call.status, call.input_tokens, call.output_tokens) == (200, BIG_PROMPT, 300)
    assert meter.usd == pytest.approx(usd(provider, BIG_PROMPT, 300))


@pytest.mark.parametrize("api", RAW)
def test_a_stream_the_upstream_cuts_off_before_its_usage_is_charged_an_estimate_never_nothing(api):
    calls: list[Call] = []
    meter = budget()
    with FakeLlmServer([reply(text="x" * 4000, usage=(BIG_PROMPT, 300), end_after_s=0.1, cut=True)]) as server:
        with proxy_for(server, meter, calls) as proxy:
            connection = send(proxy, api, stream=True)
            with pytest.raises(http.client.IncompleteRead):  # the agent's reply is cut off too
                connection.getresponse().read()
            [call] = reported(calls)
    assert call.estimated and call.output_tokens >= 1000  # 4000 characters written: about 1000 tokens
    if api == "anthropic":  # its input came in the stream's first event, before the cut
        assert call.input_tokens == BIG_PROMPT
    assert call.input_tokens > 0 and call.usd > 0
    assert (meter.input_tokens, meter.output_tokens, meter.usd) == (call.input_tokens, call.output_tokens, call.usd)


def leave_a_stream_open(proxy) -> None:
    """An agent that starts a streamed call, reads its first bytes and goes away: the call is still open."""
    connection = send(proxy, "anthropic", stream=True)
    connection.getresponse().read1(65536)
    hang_up(connection)


def test_the_run_s_end_waits_for_an_open_call_and_charges_the_upstream_s_usage():
    """The agent has gone (its sandbox closed) with a stream open whose usage comes later: the
    run's end (`settle_open`) returns once the proxy has read it to its end, with it charged."""
    calls: list[Call] = []
    meter = budget()
    with FakeLlmServer([reply(text=ANSWER, usage=(BIG_PROMPT, 300), end_after_s=1.5)]) as server:
        with proxy_for(server, meter, calls) as proxy:
            leave_a_stream_open(proxy)
            started = time.monotonic()
            assert proxy.settle_open(wait_s=120) == []  # nothing left to charge its hold
            waited = time.monotonic() - started
    assert 0.5 < waited < 10
    [call] = calls
    assert (call.input_tokens, call.output_tokens, call.estimated, call.open_at_end) == (BIG_PROMPT, 300, False, False)
    assert (meter.input_tokens, meter.output_tokens, meter.in_flight) == (BIG_PROMPT, 300, 0)


def test_a_call_charged_as_the_run_ends_is_recorded_before_the_end_goes_on(monkeypatch):
    """A call's own thread charges it, then records it. Descheduled between the two (a loaded
    machine), it finds the run's end gone on and the proxy closed: before, such a call was charged
    and never recorded (the run's tokens counted it, its trajectory had no line for it)."""
    from mlrb.models.proxy import MeteringProxy

    charge = MeteringProxy.settle

    def settle_then_stall(self, flight, used):  # as a thread the scheduler set aside for a second
        charged = charge(self, flight, used)
        time.sleep(1.0)
        return charged

    monkeypatch.setattr(MeteringProxy, "settle", settle_then_stall)
    calls: list[Call] = []
    meter = budget()
    with FakeLlmServer([reply(text=ANSWER, usage=(BIG_PROMPT, 300), end_after_s=0.5)]) as server:
        with proxy_for(server, meter, calls) as proxy:
            leave_a_stream_open(proxy)
            assert proxy.settle_open(wait_s=120) == []
        # the proxy is closed here, as the run closes it once its end has gone on
    [call] = calls
    assert (call.input_tokens, call.output_tokens, call.estimated) == (BIG_PROMPT, 300, False)
    assert (meter.input_tokens, meter.output_tokens, meter.in_flight) == (BIG_PROMPT, 300, 0)


def test_a_call_still_open_after_the_run_s_wait_is_charged_its_hold_once_and_no_call_goes_up_after():
    """An upstream that has not answered when the wait is over: the call is charged what it holds,
    recorded as an estimate open at the run's end; its answer, when it comes, charges nothing more;
    and a call made after the end is refused without going upstream."""
    calls: list[Call] = []
    meter = budget()
    with FakeLlmServer([reply(text=ANSWER, usage=(BIG_PROMPT, 300), delay_s=2.0)]) as server:
        with proxy_for(server, meter, calls) as proxy:
            connection = send(proxy, "anthropic", stream=False)
            while not server.requests:
                time.sleep(0.01)
            [cut] = proxy.settle_open(wait_s=0.2)
            held = (meter.input_tokens, meter.output_tokens, meter.usd)
            assert cut.open_at_end and cut.estimated and (cut.input_tokens, cut.output_tokens) != (0, 0)
            assert held == (cut.input_tokens, cut.output_tokens, pytest.approx(cut.usd)) and cut.usd > 0
            assert connection.getresponse().status == 200  # the upstream's answer still reaches the agent
            time.sleep(0.2)
            late = send(proxy, "anthropic", stream=False).getresponse()
            assert late.status == 400 and b"the run has ended" in late.read()
    assert [c.open_at_end for c in calls] == [True, False]  # the cut call once, then the refused one
    assert calls[1].refused and len(server.requests) == 1
    assert (meter.input_tokens, meter.output_tokens, meter.usd) == held and meter.in_flight == 0


def test_calls_made_at_once_cannot_spend_a_budget_that_one_call_s_hold_spends():
    """Four calls at once against $0.01: the first holds its most ($0.015: 1000 output tokens at
    $15 per million), so the others are answered 429 while it is in flight, and nothing of theirs
    goes upstream; once it has spent the budget, the next call is refused as out of credit."""
    calls: list[Call] = []
    meter = budget(max_usd=0.01)
    script = [reply(text="one", usage=(1000, 500), delay_s=1.5)] * 4
    with FakeLlmServer(script) as server, proxy_for(server, meter, calls) as proxy:
        client = anthropic.Anthropic(api_key=TOKEN, base_url=proxy.base_url("anthropic"), max_retries=0)
        start = threading.Barrier(4)
        outcomes: list[Any] = []

        def call() -> None:
            start.wait()
            try:
                outcomes.append(client.messages.create(model="m", max_tokens=1000, messages=[
                    {"role": "user", "content": "Solve."}]).content[0].text)  # fmt: skip
            except anthropic.APIStatusError as e:
                outcomes.append(e)

        threads = [threading.Thread(target=call) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        with pytest.raises(anthropic.BadRequestError, match=r"budget is spent \(usd\)"):
            client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "Again."}])
    refused = [o for o in outcomes if isinstance(o, anthropic.APIStatusError)]
    assert outcomes.count("one") == 1 and len(refused) == 3, outcomes
    assert all(isinstance(e, anthropic.RateLimitError) and "calls in flight hold" in e.message for e in refused)
    assert len(server.requests) == 1
    one_hold = usd("anthropic", 0, 1000)
    assert meter.usd == pytest.approx(usd("anthropic", 1000, 500)) and meter.usd <= 0.01 + one_hold
    assert meter.held.usd == 0 and meter.in_flight == 0
    assert sorted(c.status for c in calls) == [200, 400, 429, 429, 429]


# ---- the models a run may call, each at its own price ------------------------------------------
def llm_agent(name: str, url: str) -> LlmAgent:
    """An LLM agent as its config file sets it up (its model, its price), with the test's key and upstream."""
    options = yaml.safe_load((REPO / "mlrb" / "conf" / "agent" / f"{name}.yaml").read_text())["options"]
    return LlmAgent(AgentConfig(name=name, kind="llm", options={**options, "api_key_env": KEY_ENV, "base_url": url}))


def started(agent: Any, meter: Budget, tmp_path, seen: list[Call]) -> tuple[MeteringProxy, metering.CallEvents]:
    """The run's proxy for AGENT as the harness starts it, charging METER, its calls the run's
    events (and each call in SEEN too)."""
    proxy = metering.start(agent)
    assert proxy is not None
    proxy.token = TOKEN  # the run's token, as the agent is given it
    events = metering.attach(proxy, meter, open_sink(tmp_path / "trajectory.jsonl", recorder=None))
    proxy.on_call = lambda call: (seen.append(call), events.emit(call))
    return proxy, events


def test_a_model_the_config_does_not_allow_is_refused_as_the_provider_refuses_an_unknown_one(tmp_path,
                                                                                            monkeypatch):  # fmt: skip
    """agent=claude may call its configured model only; Opus is refused before anything goes
    upstream, as Anthropic answers an unknown model (404 not_found_error), and agent=gpt4o's
    other models as OpenAI does (404 model_not_found), on both of its APIs."""
    monkeypatch.setenv(KEY_ENV, ANTHROPIC_KEY)
    meter, seen = budget(), []
    with FakeLlmServer([reply(text="allowed", usage=(10, 5))] * 2) as server:
        proxy, calls = started(llm_agent("claude", server.anthropic_url), meter, tmp_path, seen)
        with proxy:
            claude = anthropic.Anthropic(api_key=TOKEN, base_url=proxy.base_url("anthropic"), max_retries=0)
            with pytest.raises(anthropic.NotFoundError) as refused:
                claude.messages.create(
                    model="claude-opus-4-1", max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
                )
            assert server.requests == []
            allowed = claude.messages.create(model="claude-sonnet-5", max_tokens=10,
                                             messages=[{"role": "user", "content": "Hi"}])  # fmt: skip
        proxy, openai_calls = started(llm_agent("gpt4o", server.openai_url), meter, tmp_path, seen)
        with proxy:
            gpt = openai.OpenAI(api_key=TOKEN, base_url=proxy.base_url("openai"), max_retries=0)
            with pytest.raises(openai.NotFoundError) as chat_refused:
                gpt.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "Hi"}])
            with pytest.raises(openai.NotFoundError) as responses_refused:
                gpt.responses.create(model="o3", input="Hi")
            gpt.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
    assert refused.value.body["error"]["type"] == "not_found_error" and "claude-opus-4-1" in refused.value.message
    assert chat_refused.value.code == responses_refused.value.code == "model_not_found"
    assert allowed.content[0].text == "allowed"
    assert [r["body"]["model"] for r in server.requests] == ["claude-sonnet-5", "gpt-4o"]
    assert list(calls.models_used) == ["claude-sonnet-5"] and list(openai_calls.models_used) == ["gpt-4o"]
    assert [(c.model, c.status, c.attempts, c.refused) for c in seen if c.refused] == [
        ("claude-opus-4-1", 404, 0, "model not allowed: 'claude-opus-4-1'"),
        ("gpt-5", 404, 0, "model not allowed: 'gpt-5'"),
        ("o3", 404, 0, "model not allowed: 'o3'"),
    ]


def test_a_program_that_calls_two_allowed_models_is_charged_each_at_its_own_price(tmp_path, monkeypatch):
    """A command agent allowed Sonnet and Opus: each call is charged at its model's price in the
    table (Opus 4.1 costs five times Sonnet 4.6), and the run knows which models it used."""
    monkeypatch.setenv(KEY_ENV, ANTHROPIC_KEY)
    options = {"command": "true", "providers": {"anthropic": {
        "api_key_env": KEY_ENV, "models": ["claude-sonnet-4-6", "claude-opus-4-1"]}}}  # fmt: skip
    meter = budget()
    with FakeLlmServer([reply(text="a", usage=(10_000, 1_000))] * 2) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.anthropic_url)
        agent = CommandAgent(AgentConfig(name="command", kind="command", options=options))
        proxy, calls = started(agent, meter, tmp_path, [])
        with proxy:
            client = anthropic.Anthropic(api_key=TOKEN, base_url=proxy.base_url("anthropic"), max_retries=0)
            for model in ("claude-sonnet-4-6", "claude-opus-4-1"):
                client.messages.create(model=model, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    sonnet, opus = (10_000 * 3 + 1_000 * 15) / 1e6, (10_000 * 15 + 1_000 * 75) / 1e6  # genai-prices' rates
    trajectory = [json.loads(line) for line in (tmp_path / "trajectory.jsonl").read_text().splitlines()]
    costs = [e["cost_usd"] for e in trajectory if e["event"] == "model_call"]
    assert costs == [pytest.approx(sonnet), pytest.approx(opus)] and opus == pytest.approx(5 * sonnet)
    assert meter.usd == pytest.approx(sonnet + opus)
    assert sorted(calls.models_used) == ["claude-opus-4-1", "claude-sonnet-4-6"]
    assert all(source.startswith("genai-prices ") for source in calls.models_used.values())


def test_an_agent_that_asks_for_a_tool_and_a_disallowed_model_gets_only_what_it_may(tmp_path, monkeypatch):
    """A refused model is no call upstream and no cost: the run's events say why it failed."""
    monkeypatch.setenv(KEY_ENV, OPENAI_KEY)
    meter, seen = budget(), []
    with FakeLlmServer([reply(tool("bash", command="ls"), usage=(10, 5))]) as server:
        proxy, calls = started(llm_agent("gpt4o", server.openai_url), meter, tmp_path, seen)
        with proxy:
            client = openai.OpenAI(api_key=TOKEN, base_url=proxy.base_url("openai"), max_retries=0)
            with pytest.raises(openai.NotFoundError):
                client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}],
                                               stream=True)  # fmt: skip
    assert server.requests == [] and meter.usd == 0 and calls.models_used == {}
    assert [(c.status, c.refused) for c in seen] == [(404, "model not allowed: 'gpt-4o-mini'")]
