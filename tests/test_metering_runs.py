"""Metering fails closed in a whole run: an agent (`agent=command`, in the default bwrap sandbox)
that hangs up on each streamed reply once its answer's text is in, before the events that carry
the usage, is still charged every call the upstream served, and its dollar budget still ends it.
Before, such calls were recorded as 0 tokens and $0, and no token or dollar limit ever stopped them."""

from __future__ import annotations

import json

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_TASK, mlflow_client, run_cli, store_args
from fake_llm_server import FakeLlmServer, reply
from test_command_agent import command_override

pytestmark = pytest.mark.integration

KEY = "sk-ant-metering-runs-real-key-4242"
INPUT_TOKENS, OUTPUT_TOKENS = 250_000, 300  # what the upstream reports for each call
# claude-sonnet-4-5 past 200k input tokens (its long-context price): $6 / $22.50 per million; the
# run names it (agent.options.model) and the program calls the model it is given ($MLRB_MODEL)
MODEL = "claude-sonnet-4-5"
CALL_USD = (INPUT_TOKENS * 6.0 + OUTPUT_TOKENS * 22.5) / 1e6

# Raw HTTP, as an agent that wants free calls would write it: a large prompt (about the tokens the
# upstream reports), read until the answer's text has come, then a reset; a short pause for the
# proxy to settle the call; up to three calls, then an honest submission (the untouched base model).
HANG_UP = """
import http.client, json, os, socket, struct, subprocess, time
from urllib.parse import urlsplit
base = urlsplit(os.environ["ANTHROPIC_BASE_URL"])
prompt = "word " * 200_000
for i in range(3):
    c = http.client.HTTPConnection(base.hostname, base.port, timeout=60)
    body = {"model": os.environ["MLRB_MODEL"], "max_tokens": 300, "stream": True,
            "messages": [{"role": "user", "content": prompt}]}
    c.request("POST", base.path.rstrip("/") + "/v1/messages", json.dumps(body),
              {"x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01",
               "content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        print("call", i, "refused:", r.status, r.read()[:200])
        break
    seen = b""
    while b"content_block_delta" not in seen:
        seen += r.read1(65536)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.sock.close()
    print("call", i, "answered, hung up")
    time.sleep(3)
subprocess.run(["python", "train.py"], check=True)  # a valid submission
"""


def test_an_agent_that_hangs_up_on_every_stream_pays_for_each_call_and_its_budget_stops_it(tmp_path, cache_dir):
    # Each answer's usage and end come a second after its text: the agent has hung up by then.
    script = [reply(text="42.", usage=(INPUT_TOKENS, OUTPUT_TOKENS), end_after_s=1.0) for _ in range(3)]
    with FakeLlmServer(script) as server:
        env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url}
        result = run_cli(*store_args(tmp_path, cache_dir), *HARNESS_TASK, "agent=command", command_override(HANG_UP),
                         f"agent.options.model={MODEL}", cwd=tmp_path, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    metrics, tags = run.data.metrics, run.data.tags
    # The first call is charged in full, which spends the smoke budget's 200k input tokens: the
    # second is refused, as the provider refuses an account out of credit.
    assert len(server.requests) == 1
    assert (metrics["input_tokens"], metrics["output_tokens"]) == (INPUT_TOKENS, OUTPUT_TOKENS)
    assert metrics["cost_usd"] == pytest.approx(CALL_USD)
    transcript = (tmp_path / "run" / "agent" / "stdout.txt").read_text()
    assert "call 0 answered, hung up" in transcript, transcript
    assert "call 1 refused: 400" in transcript and "budget is spent (input_tokens)" in transcript, transcript
    assert tags["mlrb.models_used"] == MODEL


# Calls still open when the agent stops. Each upstream reply reports 150k input tokens, well under
# claude-sonnet-4-5's long-context threshold: $3 / $15 per million.
OPEN_INPUT, OPEN_OUTPUT = 150_000, 100
OPEN_CALL_USD = (OPEN_INPUT * 3.0 + OPEN_OUTPUT * 15.0) / 1e6

# A program that hands in its submission, then opens CALLS streamed calls at once (a short prompt:
# their holds fit the budget together), reads each until its answer's text has come, and exits
# at once, the streams still open: their usage and end come seconds later.
EXIT_MID_STREAM = """
import http.client, json, os, subprocess, threading
from urllib.parse import urlsplit
subprocess.run(["python", "train.py"], check=True)  # a valid submission
base = urlsplit(os.environ["ANTHROPIC_BASE_URL"])
texts = []
def call():
    c = http.client.HTTPConnection(base.hostname, base.port, timeout=60)
    body = {"model": os.environ["MLRB_MODEL"], "max_tokens": 300, "stream": True,
            "messages": [{"role": "user", "content": "Say 42."}]}
    c.request("POST", base.path.rstrip("/") + "/v1/messages", json.dumps(body),
              {"x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01",
               "content-type": "application/json"})
    r = c.getresponse()
    seen = b""
    while b"content_block_delta" not in seen:
        seen += r.read1(65536)
    texts.append(seen)
threads = [threading.Thread(target=call) for _ in range(CALLS)]
for t in threads: t.start()
for t in threads: t.join()
print(len(texts), "answers read; leaving with the streams open", flush=True)
os._exit(0)
"""


def model_calls(tmp_path) -> list[dict]:
    lines = (tmp_path / "run" / "trajectory.jsonl").read_text().splitlines()
    return [event for event in map(json.loads, lines) if event["event"] == "model_call"]


@pytest.mark.parametrize("calls", [1, 2])
def test_calls_still_open_when_the_agent_exits_are_charged_recorded_and_named(tmp_path, cache_dir, calls):
    # Before, the run ended as the program did: the upstream served every call to its end and the
    # run recorded 0 tokens, $0, no model and no call. Two at once served 300k input tokens past a
    # 200k budget, recorded as nothing.
    script = [reply(text="42.", usage=(OPEN_INPUT, OPEN_OUTPUT), end_after_s=3.0) for _ in range(calls)]
    program = EXIT_MID_STREAM.replace("CALLS", str(calls))
    with FakeLlmServer(script) as server:
        env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url}
        result = run_cli(*store_args(tmp_path, cache_dir), *HARNESS_TASK, "agent=command", command_override(program),
                         f"agent.options.model={MODEL}", cwd=tmp_path, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{calls} answers read" in (tmp_path / "run" / "agent" / "stdout.txt").read_text()
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    metrics, tags = run.data.metrics, run.data.tags
    assert len(server.requests) == calls
    assert (metrics["input_tokens"], metrics["output_tokens"]) == (calls * OPEN_INPUT, calls * OPEN_OUTPUT)
    assert metrics["cost_usd"] == pytest.approx(calls * OPEN_CALL_USD)
    assert tags["mlrb.models_used"] == MODEL
    recorded = model_calls(tmp_path)
    assert [(c["input_tokens"], c["usage_estimated"]) for c in recorded] == [(OPEN_INPUT, False)] * calls
    assert tags["mlrb.status"] == "ok"  # the program did hand in its submission


# An honest program: its submission, then one call whose answer it waits for; the wall-time limit
# stops it before the answer's end comes.
WAITS_FOR_ITS_ANSWER = """
import anthropic, os, subprocess
subprocess.run(["python", "train.py"], check=True)  # a valid submission
client = anthropic.Anthropic(max_retries=0, timeout=600)
with client.messages.stream(model=os.environ["MLRB_MODEL"], max_tokens=300,
                            messages=[{"role": "user", "content": "Think long."}]) as stream:
    for text in stream.text_stream:
        print("text:", text, flush=True)
print("never reached: the wall time ends the program first")
"""


def test_a_call_open_when_the_wall_time_stops_the_agent_is_charged_what_the_upstream_served(tmp_path, cache_dir):
    # The answer's usage and end come 20 s after its text; the agent's wall time ends at 10 s. The run's
    # end waits for the call (by default up to budget.open_calls_wait_s, 120 s), reads it to its end
    # and charges it.
    script = [reply(text="42.", usage=(OPEN_INPUT, OPEN_OUTPUT), end_after_s=20.0)]
    with FakeLlmServer(script) as server:
        env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url}
        result = run_cli(*store_args(tmp_path, cache_dir), *HARNESS_TASK, "agent=command",
                         command_override(WAITS_FOR_ITS_ANSWER), f"agent.options.model={MODEL}",
                         "budget.wall_time_s=10", cwd=tmp_path, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    metrics, tags = run.data.metrics, run.data.tags
    assert tags["mlrb.status"] == "budget_exhausted" and tags["mlrb.stop_reason"] == "wall_time"
    assert (metrics["input_tokens"], metrics["output_tokens"]) == (OPEN_INPUT, OPEN_OUTPUT)
    assert metrics["cost_usd"] == pytest.approx(OPEN_CALL_USD)
    assert metrics["agent_time_s"] < 12  # the wait for the call is not the agent's time
    (call,) = model_calls(tmp_path)
    assert (call["input_tokens"], call["usage_estimated"]) == (OPEN_INPUT, False)
    assert tags["mlrb.models_used"] == MODEL


# A program whose every call reads a long prompt from the provider's cache, as Claude Code's and Codex's do:
# the official SDK, calling until the proxy refuses, then an honest submission.
CACHED_CALLS = """
import anthropic, os, subprocess
client = anthropic.Anthropic(max_retries=0)
for i in range(6):
    try:
        client.messages.create(model=os.environ["MLRB_MODEL"], max_tokens=100,
                               messages=[{"role": "user", "content": "Go on."}])
        print("call", i, "answered", flush=True)
    except anthropic.APIStatusError as e:
        print("call", i, "refused:", e.status_code, e.message, flush=True)
        break
subprocess.run(["python", "train.py"], check=True)  # a valid submission
"""
# Each call's usage: 200,000 prompt tokens read from the cache, 3,000 written to it (1,000 for five minutes,
# 2,000 for an hour), 100 plain input tokens, 100 output. At Claude Sonnet 5's rates ($2 input, $0.20 a cache
# read, $2.50 and $4 a write, $10 output, per million): $0.0517 a call, where plain input would be $0.4072.
CACHED_USAGE = {"input_tokens": 100, "cache_read_input_tokens": 200_000, "cache_creation_input_tokens": 3000,
                "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
                "output_tokens": 100}  # fmt: skip
CACHED_CALL_USD = (100 * 2 + 200_000 * 0.2 + 1000 * 2.5 + 2000 * 4 + 100 * 10) / 1e6


def test_a_run_of_cached_calls_costs_the_sum_of_its_priced_calls_and_its_dollar_budget_stops_it_there(
        tmp_path, cache_dir):  # fmt: skip
    """A budget of $0.13 (2.5 calls at the cached rates) admits three calls (the third while $0.10 is
    spent) and refuses the fourth; priced as plain input, the first call alone ($0.41) would have spent it.
    The run's cost_usd is the sum of its calls' charges, each kind of token kept apart in its record."""
    from genai_prices import Usage, calc_price

    billed = float(calc_price(Usage(input_tokens=203_100, cache_read_tokens=200_000, cache_write_tokens=3000,
                                    cache_write_1h_tokens=2000, output_tokens=100), "claude-sonnet-5",
                              provider_id="anthropic").total_price)  # fmt: skip
    assert billed == pytest.approx(CACHED_CALL_USD)  # what the table says is what this test says
    script = [reply(text="Noted.", usage=CACHED_USAGE) for _ in range(6)]
    with FakeLlmServer(script) as server:
        env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url}
        result = run_cli(*store_args(tmp_path, cache_dir), *HARNESS_TASK, "agent=command",
                         command_override(CACHED_CALLS), "agent.options.model=claude-sonnet-5",
                         f"budget.max_usd={2.5 * CACHED_CALL_USD:.4f}", "budget.max_input_tokens=null",
                         cwd=tmp_path, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    transcript = (tmp_path / "run" / "agent" / "stdout.txt").read_text()
    assert "call 2 answered" in transcript and "call 3 refused: 400" in transcript, transcript
    assert "budget is spent (usd)" in transcript, transcript
    assert len(server.requests) == 3
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    metrics = run.data.metrics
    recorded = model_calls(tmp_path)
    assert [c["cost_usd"] for c in recorded] == [pytest.approx(CACHED_CALL_USD, abs=1e-8)] * 3
    assert metrics["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in recorded), abs=1e-6)
    assert metrics["cost_usd"] == pytest.approx(3 * CACHED_CALL_USD, abs=1e-6)
    assert (metrics["input_tokens"], metrics["cache_read_tokens"], metrics["cache_write_tokens"],
            metrics["output_tokens"]) == (3 * 203_100, 3 * 200_000, 3 * 3000, 3 * 100)  # fmt: skip
    assert [(c["cache_read_tokens"], c["cache_write_tokens"], c["cache_write_1h_tokens"]) for c in recorded] == [
        (200_000, 3000, 2000)] * 3  # fmt: skip
    atif = json.loads((tmp_path / "run" / "trajectory.atif.json").read_text())  # ATIF keeps the cache's reads apart
    steps = [s for s in atif["steps"] if s.get("llm_call_count")]
    assert [(s["metrics"]["prompt_tokens"], s["metrics"]["cached_tokens"]) for s in steps] == [(203_100, 200_000)] * 3
    assert atif["final_metrics"]["total_cached_tokens"] == 3 * 200_000
