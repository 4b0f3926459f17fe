"""The metering proxy fails closed at its edges (mlrb/models/proxy.py, its rules in
mlrb/models/request_rules.py, the usage it reads in mlrb/models/api_shapes.py): what it forwards
upstream is what it checked, nothing it forwards reaches past the sandbox's rules, and nothing an
upstream sends back makes a served call free or a credit.

Each test is an agent's (or an upstream's) cheapest way past it, played against the real proxy
and a scripted upstream: tests/fake_llm_server.py, or a raw one here that answers bytes as given
and keeps the bytes it was sent. A proxy that does not say whether the run's task allows the
network (`network_allowed`) takes it that it does not."""

from __future__ import annotations

import http.client
import json
import math
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import anthropic
import openai
import pytest

from fake_llm_server import FakeLlmServer, anthropic_events, anthropic_reply, openai_reply, reply, responses_reply
from mlrb.agents.recording import open_sink
from mlrb.core.budget import Budget
from mlrb.core.config import BudgetConfig
from mlrb.models import metering
from mlrb.models.prices import flat
from mlrb.models.proxy import Call, MeteringProxy, Upstream
from mlrb.models.request_rules import canonical_body, parse_body

pytestmark = pytest.mark.fast

TOKEN = "mlrb-run-token-edges"
ANTHROPIC_KEY, OPENAI_KEY = "sk-ant-real-key-edges", "sk-openai-real-key-edges"
PRICES = {"anthropic": (3.0, 15.0), "openai": (2.5, 10.0)}  # USD per million tokens (input, output)
MESSAGES = [{"role": "user", "content": "Solve."}]
ANSWER = "x" * 4000  # about 1000 tokens: an estimate of a reply this long is well above nothing


def budget() -> Budget:
    return Budget(BudgetConfig(name="test", wall_time_s=600, max_steps=100))


def proxy_for(anthropic_url: str, openai_url: str, calls: list[Call], meter: Budget | None = None,
              network: bool | None = None, models: list[str] | None = None) -> MeteringProxy:  # fmt: skip
    """The proxy before ANTHROPIC_URL and OPENAI_URL, each allowing MODELS (None: any) at its price;
    NETWORK: what it is told of the task's network (None: nothing)."""

    def upstream(provider: str, url: str, key: str) -> Upstream:
        price_in, price_out = PRICES[provider]
        allowed = {m: flat(provider, m, price_in, price_out, "test") for m in models} if models else None
        return Upstream(url, key, price_in, price_out, models=allowed)

    upstreams = {"anthropic": upstream("anthropic", anthropic_url, ANTHROPIC_KEY),
                 "openai": upstream("openai", openai_url, OPENAI_KEY)}  # fmt: skip
    proxy = MeteringProxy(upstreams, TOKEN, meter or budget(), on_call=calls.append, retry_base_delay_s=0.01)
    if network is not None:
        proxy.network_allowed = network  # the run's task's rules: `network`
    return proxy


class RawUpstream:
    """A scripted upstream that answers each POST with the next (content type, body bytes) as given,
    and keeps what it was sent: (path, headers with lower-case names, body bytes)."""

    def __init__(self, answers: list[tuple[str, bytes]]):
        self.answers, self.requests = list(answers), []
        raw = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                raw.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                content_type, answer = raw.answers.pop(0)
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> RawUpstream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


PATHS = {"anthropic": "/anthropic/v1/messages", "chat": "/openai/v1/chat/completions",
         "responses": "/openai/v1/responses"}  # fmt: skip
KEY_HEADERS = {"anthropic": {"x-api-key": TOKEN, "anthropic-version": "2023-06-01"},
               "chat": {"authorization": f"Bearer {TOKEN}"}, "responses": {"authorization": f"Bearer {TOKEN}"}}  # fmt: skip


def post(proxy: MeteringProxy, api: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """An agent's call as raw HTTP: the status and the whole body it gets (IncompleteRead when the
    proxy breaks it off)."""
    connection = http.client.HTTPConnection(urlsplit(proxy.url).netloc, timeout=20)
    try:
        connection.request(
            "POST",
            PATHS[api],
            body=body,
            headers={"content-type": "application/json", **KEY_HEADERS[api], **(headers or {})},
        )
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


# ---- the body: what goes upstream is what was checked -------------------------------------------
AMBIGUOUS = {
    # Python keeps the last "model" (the allowed one); a parser that keeps the first serves Opus.
    "a key twice": b'{"model":"claude-opus-4-1","max_tokens":10,"messages":[{"role":"user","content":"Hi"}],'
                   b'"model":"m"}',
    # A parser that matches keys regardless of case (Go's) reads the second.
    "a key twice in two cases": b'{"model":"m","Model":"claude-opus-4-1","max_tokens":10,"messages":[]}',
    # The proxy's rules read this tool as a plain one; a parser that keeps the first runs a web search.
    "a tool's type twice": b'{"model":"m","max_tokens":10,"messages":[],"tools":[{"type":"web_search_20250305",'
                           b'"name":"web_search","type":"custom","input_schema":{"type":"object"}}]}',
    # Python reads 1e400 as infinity (the hold ignores it); others read it otherwise, or refuse it.
    "a number past a double": b'{"model":"m","max_tokens":1e400,"messages":[]}',
    "NaN": b'{"model":"m","max_tokens":NaN,"messages":[]}',
    # Python's parser gives up (RecursionError, not a ValueError): the proxy answered nothing at all.
    "nesting past the parser's depth": b'{"model":"m","max_tokens":10,"messages":' + b"[" * 100_000 + b"]" * 100_000
                                       + b"}",
    "a byte-order mark": b'\xef\xbb\xbf{"model":"m","max_tokens":10,"messages":[]}',
}  # fmt: skip


@pytest.mark.parametrize("body", AMBIGUOUS.values(), ids=AMBIGUOUS.keys())
def test_a_body_json_parsers_may_read_differently_is_refused_and_nothing_goes_upstream(body):
    calls: list[Call] = []
    with FakeLlmServer([reply(text="served", usage=(10, 5))]) as server:
        with proxy_for(server.anthropic_url, server.openai_url, calls, models=["m"]) as proxy:
            status, answer = post(proxy, "anthropic", body)
    assert status == 400, answer[:300]
    error = json.loads(answer)
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert server.requests == []


def test_what_goes_upstream_is_the_object_the_proxy_checked_not_the_agent_s_bytes():
    """The upstream is sent the request the proxy read and recorded, written out again: no byte of
    the agent's body that the proxy's parser passed over reaches it."""
    calls: list[Call] = []
    body = b'{ "model" : "m",\n "max_tokens": 10, "messages": [{"role": "user", "content": "caf\\u00e9 \xc3\xa9"}]}'
    with RawUpstream([("application/json", json.dumps(anthropic_reply(reply(text="ok"), "m", 1)).encode())]) as up:
        with proxy_for(up.url, up.url, calls) as proxy:
            status, _ = post(proxy, "anthropic", body, {"content-type": "text/plain; charset=utf-16"})
    assert status == 200
    [(_, headers, sent)] = up.requests
    assert sent == canonical_body(calls[0].request) and parse_body(sent) == (calls[0].request, None)
    assert headers["content-type"] == "application/json"


# ---- nothing reaches past the sandbox through the provider -----------------------------------------
URL_PDF = "https://example.com/paper.pdf"
NO_NETWORK = {  # (api, a request that has the provider reach outside the call)
    "anthropic web_search": ("anthropic", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
    "anthropic web_fetch": ("anthropic", {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}),
    "anthropic code_execution": ("anthropic", {"tools": [{"type": "code_execution_20250825",
                                                          "name": "code_execution"}]}),
    "anthropic mcp_servers": ("anthropic", {"mcp_servers": [{"type": "url", "url": "https://mcp.example.com/sse",
                                                             "name": "outside"}]}),
    "anthropic a document from a URL": ("anthropic", {"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": URL_PDF}}, {"type": "text", "text": "Summarise."}]}]}),
    "responses web_search": ("responses", {"tools": [{"type": "web_search"}]}),
    "responses mcp": ("responses", {"tools": [{"type": "mcp", "server_label": "x",
                                               "server_url": "https://mcp.example.com"}]}),
    "responses file_search": ("responses", {"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}),
    "responses code_interpreter": ("responses", {"tools": [{"type": "code_interpreter",
                                                            "container": {"type": "auto"}}]}),
    "responses a hosted shell": ("responses", {"tools": [{"type": "shell",
                                                          "environment": {"type": "container_auto"}}]}),
    "responses a file from a URL": ("responses", {"input": [{"role": "user", "content": [
        {"type": "input_file", "file_url": URL_PDF}, {"type": "input_text", "text": "Summarise."}]}]}),
    "chat web_search_options": ("chat", {"web_search_options": {}}),
    "chat an image from a URL": ("chat", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}]}]}),
}  # fmt: skip
BASE = {"anthropic": {"model": "m", "max_tokens": 10, "messages": MESSAGES},
        "chat": {"model": "m", "messages": MESSAGES}, "responses": {"model": "m", "input": "Solve."}}  # fmt: skip


def sdk_call(proxy: MeteringProxy, api: str, request: dict[str, Any]) -> Any:
    """REQUEST made with the provider's own SDK (its fields as they are: the SDK sends what it is given)."""
    body = {**BASE[api], **request}
    if api == "anthropic":
        client = anthropic.Anthropic(api_key=TOKEN, base_url=proxy.base_url("anthropic"), max_retries=0)
        extra = {k: body.pop(k) for k in list(body) if k not in ("model", "max_tokens", "messages", "tools")}
        return client.messages.create(**body, extra_body=extra)
    client_ = openai.OpenAI(api_key=TOKEN, base_url=proxy.base_url("openai"), max_retries=0)
    if api == "chat":
        return client_.chat.completions.create(**body)
    return client_.responses.create(**body)


@pytest.mark.parametrize("case", NO_NETWORK)
def test_when_the_task_allows_no_network_the_provider_may_not_reach_it_for_the_agent(case):
    """A tool the provider runs itself, a field that has it reach a server, or content it fetches from
    a URL: each is refused as the provider refuses a bad request (the SDK raises its own error, naming
    what and why), and nothing goes upstream."""
    api, request = NO_NETWORK[case]
    calls: list[Call] = []
    with FakeLlmServer([reply(text="fetched it", usage=(10, 5))]) as server:
        with proxy_for(server.anthropic_url, server.openai_url, calls) as proxy:  # told nothing: no network
            error = anthropic.BadRequestError if api == "anthropic" else openai.BadRequestError
            with pytest.raises(error, match="no network"):
                sdk_call(proxy, api, request)
    assert server.requests == []
    assert [(c.status, c.attempts) for c in calls] == [(400, 0)] and "no network" in (calls[0].refused or "")


@pytest.mark.parametrize("case", ["anthropic web_fetch", "responses mcp", "chat an image from a URL"])
def test_when_the_task_allows_the_network_the_provider_may_reach_it(case):
    api, request = NO_NETWORK[case]
    with FakeLlmServer([reply(text="fetched it", usage=(10, 5))]) as server:
        with proxy_for(server.anthropic_url, server.openai_url, [], network=True) as proxy:
            sdk_call(proxy, api, request)
    assert len(server.requests) == 1


def test_the_agent_s_own_tools_and_inline_content_go_upstream_without_network():
    """What the agent runs in its sandbox (plain tools, bash, a local shell) and content sent inline
    (a data: URL), or a URL the model gave a tool as its input, are the call's own: they go upstream."""
    anthropic_request = {"tools": [{"name": "fetch", "input_schema": {"type": "object"}},
                                   {"type": "bash_20250124", "name": "bash"}],
                         "messages": [{"role": "user", "content": "Get it."},
                                      {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "fetch",
                                                                         "input": {"url": URL_PDF}}]},
                                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                                    "content": "no network"}]}]}  # fmt: skip
    responses_request = {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}},
                                   {"type": "shell", "environment": {"type": "local"}}],
                         "input": [{"role": "user", "content": [
                             {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]}  # fmt: skip
    with FakeLlmServer([reply(text="ok", usage=(10, 5))] * 2) as server:
        with proxy_for(server.anthropic_url, server.openai_url, []) as proxy:
            sdk_call(proxy, "anthropic", anthropic_request)
            sdk_call(proxy, "responses", responses_request)
    assert len(server.requests) == 2


# ---- what the proxy cannot price, or would not see generated, is refused ---------------------------------
UNPRICED = {  # (api, a request that has the provider run or bill what the proxy does not price)
    "responses background": ("responses", {"background": True}),
    "chat n above 1": ("chat", {"n": 8}),
    "openai priority tier": ("chat", {"service_tier": "priority"}),
    "anthropic fast mode": ("anthropic", {"speed": "fast"}),
    "anthropic a pinned region": ("anthropic", {"inference_geo": "us"}),
    "anthropic fallbacks": ("anthropic", {"fallbacks": ["claude-opus-4-1"]}),
    "anthropic an advisor model": ("anthropic", {"tools": [{"type": "advisor_20260301", "name": "advisor",
                                                            "model": "claude-opus-4-1"}]}),
    "responses image_generation": ("responses", {"tools": [{"type": "image_generation"}]}),
    "responses a stored prompt": ("responses", {"prompt": {"id": "pmpt_1"}}),
    "a max_tokens the hold does not read": ("anthropic", {"max_tokens": 8192.0}),
}  # fmt: skip


@pytest.mark.parametrize("case", UNPRICED)
def test_what_the_run_does_not_price_or_would_not_see_generated_is_refused_whatever_the_network(case):
    """Another model than the one checked (fallbacks, a tool that names one), another rate (fast,
    priority, a pinned region), generation after the call is charged (a background response, read
    later by another call), several answers for one answer's hold (`n`), a hold the proxy cannot
    read: refused before anything goes upstream, even where the task allows the network."""
    api, request = UNPRICED[case]
    calls: list[Call] = []
    with FakeLlmServer([reply(text="served", usage=(10, 5))]) as server:
        with proxy_for(server.anthropic_url, server.openai_url, calls, network=True) as proxy:
            error = anthropic.BadRequestError if api == "anthropic" else openai.BadRequestError
            with pytest.raises(error, match="mlrb proxy"):
                sdk_call(proxy, api, request)
    assert server.requests == []
    assert [(c.status, c.attempts) for c in calls] == [(400, 0)]


# ---- the usage an upstream reports: never a free call, never a credit ----------------------------------
def anthropic_whole(usage: Any) -> tuple[str, bytes]:
    return "application/json", json.dumps({**anthropic_reply(reply(text=ANSWER), "m", 1), "usage": usage}).encode()


def anthropic_stream(start: Any, delta: Any) -> tuple[str, bytes]:
    """A Messages stream whose message_start says usage START and whose message_delta says DELTA."""
    events = [json.loads(e.split(b"data: ", 1)[1]) for e in anthropic_events(anthropic_reply(reply(text=ANSWER),
                                                                                            "m", 1))]  # fmt: skip
    events[0]["message"]["usage"], events[-2]["usage"] = start, delta
    return "text/event-stream", b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode())
                                         for e in events)  # fmt: skip


def openai_whole(api: str, usage: Any) -> tuple[str, bytes]:
    render = openai_reply if api == "chat" else responses_reply
    return "application/json", json.dumps({**render(reply(text=ANSWER), "m", 1), "usage": usage}).encode()


WRONG_USAGE = {  # (api, streamed, the upstream's answer)
    "anthropic a negative input": ("anthropic", False, anthropic_whole({"input_tokens": -10**9, "output_tokens": 5})),
    "anthropic a negative cache read": ("anthropic", False, anthropic_whole(
        {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": -10**9})),
    "anthropic a null output": ("anthropic", False, anthropic_whole({"input_tokens": 1000, "output_tokens": None})),
    "anthropic NaN": ("anthropic", False, anthropic_whole({"input_tokens": math.nan, "output_tokens": 5})),
    "anthropic a string": ("anthropic", False, anthropic_whole({"input_tokens": 1000, "output_tokens": "many"})),
    "chat a negative output": ("chat", False, openai_whole("chat", {"prompt_tokens": 10, "completion_tokens": -10**9})),
    "responses a negative input": ("responses", False, openai_whole("responses",
                                                                    {"input_tokens": -10**9, "output_tokens": 5})),
    "anthropic stream, a negative output at its end": ("anthropic", True, anthropic_stream(
        {"input_tokens": 1000, "output_tokens": 1}, {"output_tokens": -10**9})),
    "anthropic stream, no usage at its end": ("anthropic", True, anthropic_stream(
        {"input_tokens": 1000, "output_tokens": 1}, None)),
    "anthropic stream, a string usage at its end": ("anthropic", True, anthropic_stream(
        {"input_tokens": 1000, "output_tokens": 1}, "many")),
}  # fmt: skip


@pytest.mark.parametrize("case", WRONG_USAGE)
def test_usage_an_upstream_gets_wrong_is_charged_an_estimate_never_nothing_nor_a_credit(case):
    """A served answer of 4000 characters whose usage is negative, null, NaN or a string: the agent
    gets its answer whole, and the call is charged an estimate (about 1000 output tokens), marked so."""
    api, streamed, answer = WRONG_USAGE[case]
    calls: list[Call] = []
    meter = budget()
    with RawUpstream([answer]) as up, proxy_for(up.url, up.url + "/v1", calls, meter) as proxy:
        status, body = post(proxy, api, json.dumps({**BASE[api], "stream": streamed}).encode())
    assert status == 200 and ANSWER.encode() in body
    [call] = calls
    assert call.estimated and call.output_tokens >= len(ANSWER) // 4 and call.input_tokens > 0, call
    assert meter.usd == pytest.approx(call.usd) and call.usd > 0


def test_a_stream_is_charged_the_input_its_last_usage_says_not_its_first():
    """Anthropic's message_delta carries the call's running totals: a server-side tool loop's input
    (the pages it read) comes after message_start's count, and is charged."""
    calls: list[Call] = []
    answer = anthropic_stream(
        {"input_tokens": 1000, "output_tokens": 1},
        {"input_tokens": 90_000, "output_tokens": 1500, "cache_read_input_tokens": 10_000},
    )
    with RawUpstream([answer]) as up, proxy_for(up.url, up.url, calls, network=True) as proxy:
        status, _ = post(proxy, "anthropic", json.dumps({**BASE["anthropic"], "stream": True}).encode())
    assert status == 200
    assert (calls[0].input_tokens, calls[0].output_tokens, calls[0].estimated) == (100_000, 1500, False)


def test_a_compaction_the_provider_ran_within_the_call_is_charged():
    """Anthropic reports a server-side compaction's tokens in `usage.iterations` alone, not in the
    top-level counts: they are the call's too."""
    calls: list[Call] = []
    usage = {"input_tokens": 1000, "output_tokens": 100, "iterations": [
        {"type": "compaction", "input_tokens": 150_000, "output_tokens": 3000, "cache_creation_input_tokens": 0,
         "cache_read_input_tokens": 0},
        {"type": "message", "input_tokens": 1000, "output_tokens": 100, "cache_creation_input_tokens": 0,
         "cache_read_input_tokens": 0}]}  # fmt: skip
    with RawUpstream([anthropic_whole(usage)]) as up, proxy_for(up.url, up.url, calls) as proxy:
        post(proxy, "anthropic", json.dumps(BASE["anthropic"]).encode())
    assert (calls[0].input_tokens, calls[0].output_tokens) == (151_000, 3100)


# ---- headers -------------------------------------------------------------------------------------------
def test_headers_that_pick_another_account_to_bill_are_not_forwarded():
    """The real key the harness holds decides which organization, project or workspace a call is
    billed to, not the agent's headers."""
    picked = {"openai-organization": "org-other", "openai-project": "proj_other",
              "anthropic-workspace-id": "wrkspc_other"}  # fmt: skip
    answers = [anthropic_whole({"input_tokens": 1, "output_tokens": 1}),
               openai_whole("chat", {"prompt_tokens": 1, "completion_tokens": 1})]  # fmt: skip
    with RawUpstream(answers) as up, proxy_for(up.url, up.url + "/v1", []) as proxy:
        post(proxy, "anthropic", json.dumps(BASE["anthropic"]).encode(), picked)
        post(proxy, "chat", json.dumps(BASE["chat"]).encode(), picked)
    sent = [headers for _, headers, _ in up.requests]
    assert len(sent) == 2 and not [k for headers in sent for k in picked if k in headers]


# ---- an agent that hangs up --------------------------------------------------------------------------------
def hang_up(proxy: MeteringProxy) -> None:
    """Half a request, then a reset (no lingering: the peer reads ECONNRESET), as an agent that
    drops its connections does."""
    host, port = urlsplit(proxy.url).netloc.split(":")
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(b"POST /anthropic/v1/messages HTTP/1.1\r\nHost: proxy\r\n")
        time.sleep(0.05)  # the proxy's handler reads it and waits for the rest
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_an_agent_that_hangs_up_on_the_proxy_writes_nothing_to_the_run_s_log_and_its_next_call_is_charged(capfd):
    """What the harness prints on standard error goes to the run's log file: a traceback for every
    connection an agent resets would let it fill the log as it likes."""
    calls: list[Call] = []
    with RawUpstream([anthropic_whole({"input_tokens": 10, "output_tokens": 5})]) as up:
        with proxy_for(up.url, up.url + "/v1", calls) as proxy:
            before = threading.active_count()
            for _ in range(5):
                hang_up(proxy)
            status, _ = post(proxy, "anthropic", json.dumps(BASE["anthropic"]).encode())
            # Every handler has ended (the proxy's threads are daemons, which its close does not wait
            # for), so whatever they would print is printed by now.
            deadline = time.monotonic() + 30
            while threading.active_count() > before and time.monotonic() < deadline:
                time.sleep(0.01)
            assert threading.active_count() <= before, [t.name for t in threading.enumerate()]
    assert status == 200 and [(c.usage.input_tokens, c.usage.output_tokens) for c in calls] == [(10, 5)]
    assert calls[0].usd > 0
    printed = capfd.readouterr().err
    assert "Traceback" not in printed and "ConnectionResetError" not in printed, printed


# ---- the recording of a call: no reply an upstream sends can break it --------------------------------------
def chat_whole(message: Any) -> tuple[str, bytes]:
    body = {**openai_reply(reply(text="ok"), "m", 1), "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
    body["choices"][0]["message"] = message
    return "application/json", json.dumps(body).encode()


def chat_stream(*chunks: Any) -> tuple[str, bytes]:
    usage = {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
    return "text/event-stream", b"".join(b"data: %s\n\n" % json.dumps(c).encode() for c in (*chunks, usage)) + (
        b"data: [DONE]\n\n"
    )


MALFORMED = {  # (api, streamed, a served reply whose parts are not of the API's shape)
    "anthropic a text that is a number": ("anthropic", False, "application/json", json.dumps(
        {**anthropic_reply(reply(text="ok", usage=(10, 5)), "m", 1), "content": [{"type": "text", "text": 42}]}).encode()),
    "chat content as a list of parts": ("chat", False, *chat_whole({"role": "assistant", "content": [
        {"type": "text", "text": "ok"}]})),
    "chat a tool call that is a string": ("chat", False, *chat_whole({"role": "assistant", "tool_calls": ["bash"]})),
    "chat stream a delta that is a string": ("chat", True, *chat_stream({"choices": [{"index": 0, "delta": "ok"}]})),
    "anthropic stream an index that is a list": ("anthropic", True, "text/event-stream", b"".join(
        b"data: %s\n\n" % json.dumps(e).encode() for e in [
            {"type": "message_start", "message": {**anthropic_reply(reply(), "m", 1), "content": [],
                                                  "usage": {"input_tokens": 10, "output_tokens": 1}}},
            {"type": "content_block_start", "index": [0], "content_block": {"type": "tool_use", "id": "t",
                                                                            "name": "bash", "input": {}}},
            {"type": "content_block_delta", "index": [0], "delta": {"type": "input_json_delta", "partial_json": "{}"}},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}},
            {"type": "message_stop"}])),
}  # fmt: skip


@pytest.mark.parametrize("case", MALFORMED)
def test_a_served_reply_of_another_shape_is_recorded_and_charged_and_the_run_goes_on(case, tmp_path):
    """The run's events read each call's answer (mlrb/models/metering.py): a part of it that is not
    of the API's shape (a local server's list of content parts, a number for a text) is read as absent,
    not raised into the run at its next event as a recording failure."""
    api, streamed, content_type, answer = MALFORMED[case]
    meter, calls = budget(), []
    with RawUpstream([(content_type, answer)]) as up, proxy_for(up.url, up.url + "/v1", calls, meter) as proxy:
        events = metering.attach(proxy, meter, open_sink(tmp_path / "trajectory.jsonl", recorder=None))
        status, _ = post(proxy, api, json.dumps({**BASE[api], "stream": streamed}).encode())
    assert status == 200
    assert events.sink.deferred is None, repr(events.sink.deferred)  # else raised into the run at its next event
    events.sink.close()
    lines = [json.loads(line) for line in (tmp_path / "trajectory.jsonl").read_text().splitlines()]
    assert [e["event"] for e in lines if e["event"] == "model_call"] == ["model_call"]
    assert (meter.input_tokens, meter.output_tokens) == (10, 5)
