"""The metering proxy (mlrb/models/proxy.py): the official Anthropic and OpenAI SDKs talk HTTP to
it with the run's token, it talks to a scripted upstream (tests/fake_llm_server.py) with the
real key, and it charges what the upstream reports."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anthropic
import openai
import pytest

from fake_llm_server import FakeLlmServer, error, hang, reply, tool
from mlrb.core.budget import Budget
from mlrb.core.config import BudgetConfig
from mlrb.models.proxy import Call, MeteringProxy, Upstream
from test_bwrap_sandbox import needs_namespaces

pytestmark = pytest.mark.fast

TOKEN = "mlrb-run-token-1234"
ANTHROPIC_KEY, OPENAI_KEY = "sk-ant-real-key", "sk-openai-real-key"
MESSAGES = [{"role": "user", "content": "Solve."}]


def budget(**limits) -> Budget:
    """A run's budget: ten minutes, a hundred steps, and LIMITS (tokens, dollars)."""
    return Budget(BudgetConfig(name="test", wall_time_s=600, max_steps=100, **limits))


def proxy_for(server: FakeLlmServer, meter: Budget | None = None, calls: list[Call] | None = None) -> MeteringProxy:
    upstreams = {
        "anthropic": Upstream(
            server.anthropic_url, ANTHROPIC_KEY, price_input_per_mtok=3.0, price_output_per_mtok=15.0
        ),
        "openai": Upstream(server.openai_url, OPENAI_KEY, price_input_per_mtok=2.5, price_output_per_mtok=10.0),
    }
    on_call = calls.append if calls is not None else None
    return MeteringProxy(upstreams, TOKEN, meter or budget(), on_call=on_call, retry_base_delay_s=0.01)


def anthropic_client(proxy: MeteringProxy, key: str = TOKEN) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=key, base_url=proxy.base_url("anthropic"), max_retries=0)


def openai_client(proxy: MeteringProxy, key: str = TOKEN) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=proxy.base_url("openai"), max_retries=0)


def test_anthropic_calls_pass_through_streamed_or_not_and_are_charged_with_the_real_key_upstream():
    calls: list[Call] = []
    meter = budget()
    script = [
        reply(tool("bash", command="ls"), text="Looking.", usage=(1200, 80)),
        reply(text="Done.", usage=(1500, 120)),
    ]
    with FakeLlmServer(script) as server, proxy_for(server, meter, calls) as proxy:
        client = anthropic_client(proxy)
        message = client.messages.create(model="claude-test", max_tokens=100, messages=MESSAGES)
        with client.messages.stream(model="claude-test", max_tokens=100, messages=MESSAGES) as stream:
            streamed = stream.get_final_message()
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[1].name == "bash" and message.content[1].input == {"command": "ls"}
    assert streamed.content[0].text == "Done." and streamed.usage.output_tokens == 120
    # The upstream got the real key and never the run's token; the agent never sees the key.
    assert [r["headers"].get("x-api-key") for r in server.requests] == [ANTHROPIC_KEY, ANTHROPIC_KEY]
    assert not any(TOKEN in str(r["headers"]) for r in server.requests)
    assert [(c.stream, c.status, c.attempts, c.input_tokens, c.output_tokens) for c in calls] == [
        (False, 200, 1, 1200, 80),
        (True, 200, 1, 1500, 120),
    ]
    assert (meter.input_tokens, meter.output_tokens) == (2700, 200)
    assert meter.usd == pytest.approx((2700 * 3.0 + 200 * 15.0) / 1e6)
    assert calls[1].response[0]["type"] == "message_start" and calls[1].response[-1]["type"] == "message_stop"


def test_openai_chat_calls_pass_through_streamed_or_not_and_a_stream_is_asked_for_its_usage():
    calls: list[Call] = []
    meter = budget()
    script = [reply(tool("write_file", path="a.txt", content="x"), usage=(900, 40)), reply(text="Hi.", usage=(950, 60))]
    with FakeLlmServer(script) as server, proxy_for(server, meter, calls) as proxy:
        client = openai_client(proxy)
        completion = client.chat.completions.create(model="gpt-test", messages=MESSAGES)
        chunks = list(client.chat.completions.create(model="gpt-test", messages=MESSAGES, stream=True))
    call = completion.choices[0].message.tool_calls[0]
    assert call.function.name == "write_file" and completion.usage.prompt_tokens == 900
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi."
    assert [r["headers"].get("authorization") for r in server.requests] == [f"Bearer {OPENAI_KEY}"] * 2
    assert server.requests[1]["body"]["stream_options"] == {"include_usage": True}  # added by the proxy
    assert [(c.stream, c.input_tokens, c.output_tokens) for c in calls] == [(False, 900, 40), (True, 950, 60)]
    assert meter.usd == pytest.approx(((900 + 950) * 2.5 + (40 + 60) * 10.0) / 1e6)


def test_openai_responses_calls_pass_through_streamed_or_not_and_are_charged():
    calls: list[Call] = []
    meter = budget()
    script = [
        reply(tool("shell", command="ls"), text="Listing.", usage=(700, 30)),
        reply(text="Done.", usage=(800, 20)),
    ]
    with FakeLlmServer(script) as server, proxy_for(server, meter, calls) as proxy:
        client = openai_client(proxy)
        response = client.responses.create(model="gpt-test", input="Solve.")
        events = list(client.responses.create(model="gpt-test", input="Solve.", stream=True))
    assert response.output_text == "Listing." and response.output[1].name == "shell"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Done."
    assert events[-1].type == "response.completed" and events[-1].response.usage.output_tokens == 20
    assert [r["path"] for r in server.requests] == ["/v1/responses"] * 2
    assert [(c.stream, c.input_tokens, c.output_tokens) for c in calls] == [(False, 700, 30), (True, 800, 20)]
    assert meter.usd == pytest.approx(((700 + 800) * 2.5 + (30 + 20) * 10.0) / 1e6)


def test_a_key_that_is_not_the_run_s_token_is_refused_in_the_provider_s_shape_and_nothing_goes_upstream():
    calls: list[Call] = []
    with FakeLlmServer([reply(text="never")]) as server, proxy_for(server, calls=calls) as proxy:
        with pytest.raises(anthropic.AuthenticationError):
            anthropic_client(proxy, key=ANTHROPIC_KEY).messages.create(model="m", max_tokens=10, messages=MESSAGES)
        with pytest.raises(openai.AuthenticationError):
            openai_client(proxy, key="sk-guess").chat.completions.create(model="m", messages=MESSAGES)
    assert server.requests == []
    assert [(c.status, c.refused) for c in calls] == [(401, "the API key is not this run's token")] * 2


def test_once_the_budget_is_spent_calls_are_refused_as_out_of_credit_and_nothing_goes_upstream():
    calls: list[Call] = []
    meter = budget(max_output_tokens=150)
    with FakeLlmServer([reply(text="a", usage=(10, 100)), reply(text="b", usage=(10, 100))]) as server:
        with proxy_for(server, meter, calls) as proxy:
            client = anthropic_client(proxy)
            for _ in range(2):  # 100 then 200 output tokens: the second call is the one that spends it
                client.messages.create(model="m", max_tokens=10, messages=MESSAGES)
            with pytest.raises(anthropic.BadRequestError, match=r"budget is spent \(output_tokens\)"):
                client.messages.create(model="m", max_tokens=10, messages=MESSAGES)
            with pytest.raises(openai.RateLimitError, match="budget is spent") as refused:
                openai_client(proxy).chat.completions.create(model="m", messages=MESSAGES)
    assert refused.value.code == "insufficient_quota"  # OpenAI's "out of credit", which agents do not retry
    assert len(server.requests) == 2
    assert [c.refused for c in calls] == [None, None, "budget spent: output_tokens", "budget spent: output_tokens"]


def test_a_transient_upstream_failure_is_retried_by_the_proxy_and_the_agent_sees_one_answer():
    calls: list[Call] = []
    with FakeLlmServer([error(529, "overloaded"), error(500), reply(text="ok", usage=(5, 5))]) as server:
        with proxy_for(server, calls=calls) as proxy:
            message = anthropic_client(proxy).messages.create(model="m", max_tokens=10, messages=MESSAGES)
    assert message.content[0].text == "ok"
    assert len(server.requests) == 3 and [(c.status, c.attempts) for c in calls] == [(200, 3)]


def test_the_last_step_s_call_goes_through_and_only_tokens_dollars_and_time_refuse_calls():
    """The steps limit ends a run between steps, never the call of the step under way (a
    command agent's whole run is one step: with max_steps 1 it must still reach its model)."""
    meter = Budget(BudgetConfig(name="test", wall_time_s=600, max_steps=1))
    meter.record_step()
    assert meter.exhausted() == "steps" and meter.spent() is None
    with FakeLlmServer([reply(text="still mine", usage=(5, 5))]) as server, proxy_for(server, meter) as proxy:
        message = anthropic_client(proxy).messages.create(model="m", max_tokens=10, messages=MESSAGES)
    assert message.content[0].text == "still mine"


def test_an_agent_s_wait_bounds_the_upstream_the_proxy_answers_504_first_and_records_the_call():
    calls: list[Call] = []
    with FakeLlmServer([hang(30)]) as server, proxy_for(server, calls=calls) as proxy:
        client = anthropic_client(proxy)
        started = time.monotonic()
        with pytest.raises(anthropic.APIStatusError, match="did not answer within 1 s") as e:
            client.messages.create(model="m", max_tokens=10, messages=MESSAGES, timeout=10,
                                   extra_headers={"x-mlrb-timeout-s": "1", "x-mlrb-attempt": "3"})  # fmt: skip
        waited = time.monotonic() - started
    assert e.value.status_code == 504 and 1.0 <= waited < 5.0
    assert [(c.status, c.timeout_s, c.agent_attempt) for c in calls] == [(504, 1.0, 3)]
    assert not any(h.startswith("x-mlrb") for h in server.requests[0]["headers"])  # the harness's own headers


def test_a_server_that_reports_no_usage_is_charged_an_estimate_and_the_call_says_so():
    calls: list[Call] = []
    meter = budget()
    with FakeLlmServer([reply(text="x" * 400, usage=None)]) as server, proxy_for(server, meter, calls) as proxy:
        openai_client(proxy).chat.completions.create(model="m", messages=MESSAGES)
    [call] = calls
    assert call.estimated and call.output_tokens >= 100 and call.input_tokens > 0  # about 4 characters a token
    assert (meter.input_tokens, meter.output_tokens) == (call.input_tokens, call.output_tokens)


def test_a_stream_is_passed_on_as_it_arrives_not_held_back():
    calls: list[Call] = []
    with (
        FakeLlmServer([reply(text="slow", usage=(5, 5), gap_s=1.5)]) as server,
        proxy_for(server, calls=calls) as proxy,
    ):
        started = time.monotonic()
        with anthropic_client(proxy).messages.stream(model="m", max_tokens=10, messages=MESSAGES) as stream:
            first = next(iter(stream))
            first_at = time.monotonic() - started
            stream.get_final_message()
        whole = time.monotonic() - started
    assert first.type == "message_start"
    assert first_at < 1.0 <= 1.5 <= whole  # the first event came before the upstream's pause ended
    assert calls[0].first_byte_s is not None and calls[0].first_byte_s < 1.0


def anthropic_stream(proxy: MeteringProxy) -> None:
    with anthropic_client(proxy).messages.stream(model="m", max_tokens=10, messages=MESSAGES) as stream:
        stream.get_final_message()


STREAMS = {
    "anthropic": anthropic_stream,
    "openai chat": lambda proxy: list(
        openai_client(proxy).chat.completions.create(model="m", messages=MESSAGES, stream=True)
    ),
    "openai responses": lambda proxy: list(openai_client(proxy).responses.create(model="m", input="Hi", stream=True)),
}


@pytest.mark.parametrize("api", STREAMS)
def test_when_an_sdk_has_a_stream_s_answer_the_call_is_already_charged_and_recorded(api):
    # An SDK may stop at a stream's closing event (the OpenAI one stops at [DONE]), not at the
    # end of its bytes; the upstream here waits before it closes the stream.
    calls: list[Call] = []
    meter = budget()
    with (
        FakeLlmServer([reply(text="Hi.", usage=(50, 7), linger_s=0.5)]) as server,
        proxy_for(server, meter, calls) as proxy,
    ):
        STREAMS[api](proxy)
        seen = [(c.stream, c.input_tokens, c.output_tokens) for c in calls]
        charged = meter.output_tokens
    assert seen == [(True, 50, 7)] and charged == 7


# ---- a sandbox's only way to a model: the proxy ---------------------------------------------
# What an agent inside runs: a Messages call to its model URL with the run's token, then a try
# at the upstream itself (the host's loopback port), printed as one JSON line.
CLIENT = """
import http.client, json, os, sys, urllib.parse
url = urllib.parse.urlsplit(os.environ["MODEL_URL"])
connection = http.client.HTTPConnection(url.netloc, timeout=20)
body = json.dumps({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
connection.request("POST", "/anthropic/v1/messages", body=body,
                   headers={"x-api-key": os.environ["TOKEN"], "content-type": "application/json"})
answer = json.loads(connection.getresponse().read())
try:
    http.client.HTTPConnection("127.0.0.1", int(os.environ["UPSTREAM_PORT"]), timeout=3).request("GET", "/")
    direct = "reached"
except OSError as e:
    direct = type(e).__name__
print(json.dumps({"text": answer["content"][0]["text"], "direct": direct, "keys": sorted(
    k for k, v in os.environ.items() if "sk-ant-real" in v)}))
"""


def sandbox_of(kind: str, tmp_path, endpoint):
    from mlrb.core.config import SandboxConfig
    from mlrb.core.registry import SANDBOXES, load
    from mlrb.sandbox.base import Limits

    (tmp_path / "ws").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "ws" / "client.py").write_text(CLIENT)
    sandbox_class = load(SANDBOXES[kind])
    return sandbox_class(SandboxConfig(kind=kind, command_timeout_s=60), tmp_path / "ws", tmp_path / "data",
                         f"proxy-{kind}-{tmp_path.name[-8:]}", Limits(cpus=1, memory_gb=1), model_endpoint=endpoint)  # fmt: skip


def bridge_case(kind: str, tmp_path):
    calls: list[Call] = []
    with FakeLlmServer([reply(text="through the proxy", usage=(7, 3))]) as server:
        with MeteringProxy({"anthropic": Upstream(server.anthropic_url, ANTHROPIC_KEY)}, TOKEN, budget(),
                           on_call=calls.append, unix_socket=True) as proxy:  # fmt: skip
            sandbox = sandbox_of(kind, tmp_path, proxy.endpoint())
            try:
                env = f"MODEL_URL={sandbox.model_url} TOKEN={TOKEN} UPSTREAM_PORT={server.port}"
                result = sandbox.exec(f"{env} python client.py", timeout_s=60)
            finally:
                sandbox.close()
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["text"] == "through the proxy" and seen["keys"] == []  # the real key is nowhere inside
    assert [(c.status, c.input_tokens, c.output_tokens) for c in calls] == [(200, 7, 3)]
    assert server.requests[0]["headers"]["x-api-key"] == ANTHROPIC_KEY
    return seen


# Docker's case is in test_docker_sandbox.py (a system test: it needs the engine).
@needs_namespaces
def test_an_agent_in_bwrap_reaches_the_model_only_through_the_proxy(tmp_path):
    seen = bridge_case("bwrap", tmp_path)
    assert seen["direct"] in ("ConnectionRefusedError", "OSError")  # no way to the host's loopback


def test_an_unconfined_agent_gets_the_proxy_s_loopback_url(tmp_path):
    seen = bridge_case("unconfined", tmp_path)
    assert seen["direct"] == "reached"  # unconfined: nothing stops it, as the sandbox's page says


def test_the_socket_folder_of_a_run_killed_with_sigkill_is_removed_by_the_next_proxy():
    """A harness killed with SIGKILL leaves its proxy's socket folder in the temp folder; the next proxy
    started on the machine removes it, and not the folder of a proxy that runs."""
    killed = textwrap.dedent("""
        import os
        from mlrb.core.budget import Budget
        from mlrb.core.config import BudgetConfig
        from mlrb.models.proxy import MeteringProxy
        proxy = MeteringProxy({}, "token", Budget(BudgetConfig(name="test", wall_time_s=60)), unix_socket=True)
        print(proxy.socket_dir, flush=True)
        os.kill(os.getpid(), 9)
    """)
    result = subprocess.run([sys.executable, "-c", killed], capture_output=True, text=True, timeout=60)
    assert result.returncode == -9, result.stderr[-3000:]
    left = Path(result.stdout.strip())
    assert (left / "model.sock").exists()  # nothing could remove it
    with MeteringProxy({}, TOKEN, budget(), unix_socket=True) as running:
        assert not left.exists()
        with MeteringProxy({}, TOKEN, budget(), unix_socket=True) as another:
            assert running.socket_dir.is_dir() and another.socket_dir.is_dir()  # their owner runs
    assert not running.socket_dir.exists() and not another.socket_dir.exists()  # each removed its own


def test_a_query_string_goes_upstream_as_it_came():
    with FakeLlmServer([reply(text="beta", usage=(1, 1))]) as server, proxy_for(server) as proxy:
        client = anthropic.Anthropic(api_key=TOKEN, base_url=proxy.base_url("anthropic"), max_retries=0)
        client.messages.create(model="m", max_tokens=10, messages=MESSAGES, extra_query={"beta": "true"})
    assert server.requests[0]["path"] == "/v1/messages?beta=true"  # as Claude Code sends it
