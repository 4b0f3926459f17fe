"""Metering fails closed in a whole run: an agent (`agent=command`, in the default bwrap sandbox)
that hangs up on each streamed reply once its answer's text is in, before the events that carry
the usage, is still charged every call the upstream served, and its dollar budget still ends it.
Before, such calls were recorded as 0 tokens and $0, and no token or dollar limit ever stopped them."""

from __future__ import annotations

import pytest

from conftest import PLUMBING, mlflow_client, run_cli, store_args
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
import http.client, json, os, shutil, socket, struct, time
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
shutil.copytree(os.path.join(os.environ["MLRB_DATA"], "base_model"), "submission")
"""


def test_an_agent_that_hangs_up_on_every_stream_pays_for_each_call_and_its_budget_stops_it(tmp_path, plumbing_cache):
    # Each answer's usage and end come a second after its text: the agent has hung up by then.
    script = [reply(text="42.", usage=(INPUT_TOKENS, OUTPUT_TOKENS), end_after_s=1.0) for _ in range(3)]
    with FakeLlmServer(script) as server:
        env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url}
        result = run_cli(*store_args(tmp_path, plumbing_cache), PLUMBING, "agent=command", command_override(HANG_UP),
                         f"agent.options.model={MODEL}", cwd=tmp_path, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
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
