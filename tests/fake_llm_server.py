"""A scripted model server on loopback that speaks the Anthropic Messages API
(POST /v1/messages), OpenAI Chat Completions (POST /v1/chat/completions) and OpenAI
Responses (POST /v1/responses), streaming (server-sent events, when the request says
`"stream": true`) or not.

It plays a list of scripted turns, one per request, in the wire format of the
endpoint asked, and records every request (path, headers with lower-case names, JSON body) so tests
can assert on what the real SDK clients sent.

    server = FakeLlmServer([reply(tool("bash", command="ls")), error(429), reply(tool("submit"))])
    server.anthropic_url  # for ANTHROPIC_BASE_URL / agent.options.base_url
    server.openai_url     # for OPENAI_BASE_URL / agent.options.base_url

Given `models`, it serves those alone, as the real APIs do: a request for any other model is
answered as the provider answers a model it does not have (Anthropic: 404 `not_found_error`
"model: NAME"; OpenAI: 404 with the code `model_not_found`), and plays no turn.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def reply(*tool_calls: dict[str, Any], text: str = "", usage=(1000, 100), delay_s: float = 0.0, gap_s: float = 0.0,
          linger_s: float = 0.0, end_after_s: float = 0.0, cut: bool = False, searches: int = 0,
          service_tier: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A model turn: some text and tool calls, with the usage the server reports: (input, output), or
    the API's own usage object as it is sent (a dict: say Anthropic's cache fields), or None (none).
    Streamed, its first event comes at once and the rest `gap_s` later; its last two events (those
    that carry its usage and its end, as a long answer's come late) `end_after_s` after the others,
    or, with `cut`, never: the connection breaks there; the stream closes `linger_s` after its
    last event. A Responses reply holds `searches` web searches the provider ran (web_search_call
    items; Anthropic reports its own in its usage's `server_tool_use`). An OpenAI reply says it was
    served at `service_tier` (at the top of a completion, of each chunk, of a Responses response;
    Anthropic says its tier and speed in its usage, given in `usage`)."""
    return {"kind": "reply", "text": text, "tool_calls": list(tool_calls), "usage": usage, "delay_s": delay_s,
            "gap_s": gap_s, "linger_s": linger_s, "end_after_s": end_after_s, "cut": cut,
            "searches": searches, "service_tier": service_tier}  # fmt: skip


def error(status: int, message: str = "scripted failure") -> dict[str, Any]:
    return {"kind": "error", "status": status, "message": message}


def hang(seconds: float) -> dict[str, Any]:
    """No answer for `seconds`, then a turn that submits (if the client still listens)."""
    return {**reply(tool("submit", summary="late")), "delay_s": seconds}


ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    429: "rate_limit_error",
    500: "api_error",
}


class FakeLlmServer:
    def __init__(self, script: list[dict[str, Any]], port: int = 0, models: list[str] | None = None):
        self.script = list(script)
        self.models = models  # None: any model
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self.handler_class())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeLlmServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def next_turn(self, request: dict[str, Any]) -> dict[str, Any] | None:
        with self.lock:
            self.requests.append(request)
            model = request["body"].get("model")
            if self.models is not None and model not in self.models:
                return {"kind": "no_such_model", "model": model}
            return self.script.pop(0) if self.script else None

    def handler_class(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Headers and body go out in separate writes: without this, Nagle's algorithm holds
                # the body until the client acknowledges the headers (about 40 ms per call).
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args) -> None:  # keep the test output quiet
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                turn = fake.next_turn(
                    {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
                )
                path = self.path.partition("?")[0]  # Claude Code asks /v1/messages?beta=true
                anthropic, responses = path.endswith("/v1/messages"), path.endswith("/v1/responses")
                if not (anthropic or responses or path.endswith("/chat/completions")):
                    return self.send(404, {"error": {"type": "not_found", "message": self.path}})
                if turn is None:
                    return self.send(400, error_body(anthropic, 400, "fake server: the script is exhausted"))
                if turn["kind"] == "error":
                    return self.send(turn["status"], error_body(anthropic, turn["status"], turn["message"]))
                if turn["kind"] == "no_such_model":
                    return self.send(404, no_such_model(anthropic, turn["model"]))
                if turn["delay_s"]:
                    time.sleep(turn["delay_s"])
                render = anthropic_reply if anthropic else responses_reply if responses else openai_reply
                reply = render(turn, body.get("model", "fake"), len(fake.requests))
                if body.get("stream"):
                    if anthropic:
                        events = anthropic_events(reply)
                    else:
                        events = responses_events(reply) if responses else openai_chunks(reply, body)
                    return self.stream(events, turn)
                self.send(200, reply)

            def stream(self, events: list[bytes], turn: dict[str, Any]) -> None:
                gap_s, linger_s = turn.get("gap_s", 0.0), turn.get("linger_s", 0.0)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i, event in enumerate(events):
                    if i == len(events) - 2 and (turn.get("end_after_s") or turn.get("cut")):
                        time.sleep(turn.get("end_after_s", 0.0))
                        if turn.get("cut"):
                            self.close_connection = True
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
                    if i == 0 and gap_s:
                        time.sleep(gap_s)
                time.sleep(linger_s)
                self.wfile.write(b"0\r\n\r\n")

            def send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                    pass

        return Handler


def error_body(anthropic: bool, status: int, message: str) -> dict[str, Any]:
    kind = ANTHROPIC_ERRORS.get(status, "api_error")
    if anthropic:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "code": None, "param": None}}


def no_such_model(anthropic: bool, model: str) -> dict[str, Any]:
    """The provider's answer to a model it does not have (the bodies its APIs send)."""
    if anthropic:
        return {"type": "error", "error": {"type": "not_found_error", "message": f"model: {model}"},
                "request_id": "req_fake"}  # fmt: skip
    message = f"The model `{model}` does not exist or you do not have access to it."
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "model_not_found"}}


def anthropic_reply(turn: dict[str, Any], model: str, n: int) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": turn["text"]}] if turn["text"] else []
    for i, call in enumerate(turn["tool_calls"]):
        content.append({"type": "tool_use", "id": f"toolu_{n}_{i}", "name": call["name"], "input": call["arguments"]})
    out: dict[str, Any] = {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if turn["tool_calls"] else "end_turn",
        "stop_sequence": None,
    }
    if isinstance(turn["usage"], dict):
        out["usage"] = turn["usage"]
    elif turn["usage"] is not None:
        out["usage"] = {"input_tokens": turn["usage"][0], "output_tokens": turn["usage"][1]}
    else:
        out["usage"] = None
    return out


def openai_reply(turn: dict[str, Any], model: str, n: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn["text"] or None}
    if turn["tool_calls"]:
        message["tool_calls"] = [
            {
                "id": f"call_{n}_{i}",
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
            }
            for i, call in enumerate(turn["tool_calls"])
        ]
    out: dict[str, Any] = {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "finish_reason": "tool_calls" if turn["tool_calls"] else "stop", "message": message}],
    }
    if turn.get("service_tier") is not None:
        out["service_tier"] = turn["service_tier"]
    if isinstance(turn["usage"], dict):
        out["usage"] = turn["usage"]
    elif turn["usage"] is not None:
        prompt, completion = turn["usage"]
        out["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return out


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def anthropic_events(message: dict[str, Any]) -> list[bytes]:
    """A Messages reply as the stream of events the API sends for it."""
    usage = message["usage"] or {"input_tokens": 0, "output_tokens": 0}
    start = {  # the prompt's tokens (its cache's too), and the first output token
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {**usage, "output_tokens": 1},
    }
    events = [sse({"type": "message_start", "message": start}, "message_start")]
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            opening, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [sse({"type": "content_block_start", "index": i, "content_block": opening}, "content_block_start"),
                   sse({"type": "content_block_delta", "index": i, "delta": delta}, "content_block_delta"),
                   sse({"type": "content_block_stop", "index": i}, "content_block_stop")]  # fmt: skip
    events += [sse({"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]}}, "message_delta"),
               sse({"type": "message_stop"}, "message_stop")]  # fmt: skip
    return events


def openai_chunks(completion: dict[str, Any], request: dict[str, Any]) -> list[bytes]:
    """A chat completion as the chunks the API streams for it (its usage last when asked for)."""
    head = {k: completion[k] for k in ("id", "created", "model", "service_tier") if k in completion} | {
        "object": "chat.completion.chunk"}  # fmt: skip
    choice = completion["choices"][0]
    message = choice["message"]
    chunks = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    if message.get("content"):
        chunks.append(
            {**head, "choices": [{"index": 0, "delta": {"content": message["content"]}, "finish_reason": None}]}
        )
    for i, call in enumerate(message.get("tool_calls") or []):
        delta = {"tool_calls": [{"index": i, **call}]}
        chunks.append({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
    if (request.get("stream_options") or {}).get("include_usage") and completion.get("usage"):
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
    return [sse(chunk) for chunk in chunks] + [sse("[DONE]")]


def responses_reply(turn: dict[str, Any], model: str, n: int) -> dict[str, Any]:
    """A turn as an OpenAI Responses response: a message item, then a function_call item per tool call."""
    output: list[dict[str, Any]] = [{"type": "web_search_call", "id": f"ws_{n}_{i}", "status": "completed",
                                     "action": {"type": "search", "query": "q"}}
                                    for i in range(turn.get("searches", 0))]  # fmt: skip
    if turn["text"]:
        output.append({"type": "message", "id": f"msg_{n}", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": turn["text"], "annotations": []}]})  # fmt: skip
    for i, call in enumerate(turn["tool_calls"]):
        output.append({"type": "function_call", "id": f"fc_{n}_{i}", "call_id": f"call_{n}_{i}", "name": call["name"],
                       "arguments": json.dumps(call["arguments"]), "status": "completed"})  # fmt: skip
    out: dict[str, Any] = {"id": f"resp_{n}", "object": "response", "created_at": 0, "status": "completed",
                           "model": model, "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
                           "tools": []}  # fmt: skip
    if turn.get("service_tier") is not None:
        out["service_tier"] = turn["service_tier"]
    if isinstance(turn["usage"], dict):
        out["usage"] = turn["usage"]
    elif turn["usage"] is not None:
        prompt, completion = turn["usage"]
        out["usage"] = {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion,
                        "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
    return out


def responses_events(response: dict[str, Any]) -> list[bytes]:
    """A Responses response as the events the API streams for it, the whole response last."""
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events = [{"type": "response.created", "response": started}]
    for index, item in enumerate(response["output"]):
        events.append(
            {"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress"}}
        )
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append({"type": "response.output_text.delta", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "delta": text})  # fmt: skip
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    return [sse({**event, "sequence_number": i}, event["type"]) for i, event in enumerate(events)]


if __name__ == "__main__":  # python tests/fake_llm_server.py TURNS.json: serve them; the port on the first line
    import sys

    with open(sys.argv[1]) as f:  # each turn a list of [tool name, arguments]
        turns = [reply(*(tool(name, **arguments) for name, arguments in calls)) for calls in json.load(f)]
    served = FakeLlmServer(turns)
    print(served.port, flush=True)
    threading.Event().wait()  # until killed
