"""What the model APIs' messages say, read from their JSON as the metering proxy sees it: the
Anthropic Messages API, OpenAI Chat Completions and OpenAI Responses, whole or streamed.

- `reply_of`: a call's answer: the model's text, the tools it asked for (id, name, arguments)
  and why it stopped;
- `tool_results_of`: the tools' results an agent sends back in its next request (id, output,
  whether it failed);
- `usage_of`, `tokens_of`: the tokens a call used, read the same for every shape by the metering
  proxy (mlrb/harness/proxy.py) and the built-in agent's providers (mlrb/agents/providers.py).

Together they let the harness see an outside agent's tool calls without its help: asked in one
call's answer, answered in the next call's request.
"""

from __future__ import annotations

import json
from typing import Any

Reply = tuple[str, list[dict[str, Any]], str | None]  # text, tool calls, stop reason


def reply_of(response: Any, stream: bool) -> Reply:
    """The text, tool calls ({"id", "name", "arguments"}) and stop reason of an answer: a JSON
    body, or a stream's events in order."""
    if stream and isinstance(response, list):
        return streamed_reply([e for e in response if isinstance(e, dict)])
    if not isinstance(response, dict):
        return "", [], None
    if "output" in response:  # Responses
        return responses_reply(response)
    if "content" in response:  # Anthropic
        blocks = [b for b in response.get("content") or [] if isinstance(b, dict)]
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        tools = [tool(b.get("id"), b.get("name"), b.get("input")) for b in blocks if b.get("type") == "tool_use"]
        return text, tools, response.get("stop_reason")
    choice = (response.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    tools = [tool(t.get("id"), (t.get("function") or {}).get("name"), (t.get("function") or {}).get("arguments"))
             for t in message.get("tool_calls") or []]  # fmt: skip
    return message.get("content") or "", tools, choice.get("finish_reason")


def usage_of(body: Any) -> tuple[int, int] | None:
    """(input tokens, output tokens) of a whole JSON response (or a stream's Anthropic message or
    Responses response); None when it reports none."""
    return tokens_of(body.get("usage") if isinstance(body, dict) else None)


def tokens_of(usage: Any) -> tuple[int, int] | None:
    """(input tokens, output tokens) of a `usage` object, in any API's shape; None when it is not one.
    Chat Completions: prompt_tokens and completion_tokens. Anthropic and Responses: input_tokens and
    output_tokens; Anthropic reports cached prompt tokens apart from input_tokens, and all of them were
    read, so they are input too (Responses counts its cached tokens within input_tokens)."""
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage:  # Chat Completions
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    cached = int(usage.get("cache_creation_input_tokens") or 0) + int(usage.get("cache_read_input_tokens") or 0)
    return int(usage.get("input_tokens") or 0) + cached, int(usage.get("output_tokens") or 0)


def streamed_reply(events: list[dict[str, Any]]) -> Reply:
    """An answer put together from its stream: Anthropic's content blocks and deltas, Chat
    Completions' chunks, or the whole response a Responses stream ends with."""
    finished = [e.get("response") for e in events if e.get("type") == "response.completed"]
    if finished and isinstance(finished[-1], dict):  # Responses
        return responses_reply(finished[-1])
    texts: list[str] = []
    calls: dict[int, dict[str, Any]] = {}  # by the block's or the tool call's index
    stop = None
    for event in events:
        kind = event.get("type")
        if kind == "content_block_start":  # Anthropic: a tool_use block opens with its id and name
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                calls[event.get("index", len(calls))] = {"id": block.get("id"), "name": block.get("name"), "json": ""}
        delta = event.get("delta") or {}
        if kind == "content_block_delta":
            if delta.get("type") == "input_json_delta" and event.get("index") in calls:
                calls[event["index"]]["json"] += delta.get("partial_json") or ""
            texts.append(delta.get("text") or "")
        stop = delta.get("stop_reason") or stop  # Anthropic's message_delta
        for choice in event.get("choices") or []:  # Chat Completions
            chunk = choice.get("delta") or {}
            texts.append(chunk.get("content") or "")
            for part in chunk.get("tool_calls") or []:
                call = calls.setdefault(part.get("index", 0), {"id": None, "name": None, "json": ""})
                function = part.get("function") or {}
                call["id"] = part.get("id") or call["id"]
                call["name"] = function.get("name") or call["name"]
                call["json"] += function.get("arguments") or ""
            stop = choice.get("finish_reason") or stop
    tools = [tool(c["id"], c["name"], c["json"] or "{}") for _, c in sorted(calls.items())]
    return "".join(texts), tools, stop


def responses_reply(response: dict[str, Any]) -> Reply:
    """The text, function calls and status of an OpenAI Responses response."""
    items = [item for item in response.get("output") or [] if isinstance(item, dict)]
    text = "".join(part.get("text", "") for item in items if item.get("type") == "message"
                   for part in item.get("content") or [] if part.get("type") == "output_text")  # fmt: skip
    tools = [tool(item.get("call_id"), item.get("name"), item.get("arguments")) for item in items
             if item.get("type") == "function_call"]  # fmt: skip
    return text, tools, response.get("status")


def tool(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A tool call, its arguments as an object where they are JSON (OpenAI sends a string)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            arguments = {"raw": arguments}
    if not isinstance(arguments, dict):
        arguments = {"value": arguments}
    return {"id": str(call_id or ""), "name": str(name or ""), "arguments": arguments}


def tool_results_of(turns: list[Any]) -> list[tuple[str, str, bool]]:
    """(tool call id, output, failed) of each tool result in TURNS: a request's messages
    (Anthropic's tool_result blocks, Chat Completions' `tool` messages) or its input items
    (Responses' function_call_output)."""
    found = []
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        if turn.get("type") == "function_call_output":  # Responses
            found.append((str(turn.get("call_id") or ""), text_of(turn.get("output")), False))
        elif turn.get("role") == "tool":  # Chat Completions
            found.append((str(turn.get("tool_call_id") or ""), text_of(turn.get("content")), False))
        elif isinstance(turn.get("content"), list):  # Anthropic
            for block in turn["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    result = (str(block.get("tool_use_id") or ""), text_of(block.get("content")),
                              bool(block.get("is_error")))  # fmt: skip
                    found.append(result)
    return found


def text_of(content: Any) -> str:
    """A result's content as text: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content)
