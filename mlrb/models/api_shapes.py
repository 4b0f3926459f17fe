"""What the model APIs' messages say, read from their JSON as the metering proxy sees it: the
Anthropic Messages API, OpenAI Chat Completions and OpenAI Responses, whole or streamed.

- `reply_of`: a call's answer: the model's text, the tools it asked for (id, name, arguments)
  and why it stopped;
- `tool_results_of`: the tools' results an agent sends back in its next request (id, output,
  whether it failed);
- `usage_of`, `tokens_of`, `delta_tokens_of`: the tokens a call used (`Usage`: input, output, and the
  prompt's tokens read from and written to the provider's cache, each apart), read the same for every
  shape by the metering proxy (mlrb/models/proxy.py) and the built-in agent's providers
  (mlrb/models/providers.py); a count that is not a whole number of at least 0 is no usage;
- `tier_of`: the tier the provider says it served a call at (OpenAI's `service_tier`, Anthropic's
  fast mode), which the call is priced at (mlrb/models/request_rules.py's `billed_tier`).

Together they let the harness see an outside agent's tool calls without its help: asked in one
call's answer, answered in the next call's request.
"""

from __future__ import annotations

import json
import math
from dataclasses import astuple, dataclass, replace
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
        blocks = objects(response.get("content"))
        text = "".join(string(b.get("text")) for b in blocks if b.get("type") == "text")
        tools = [tool(b.get("id"), b.get("name"), b.get("input")) for b in blocks if b.get("type") == "tool_use"]
        return text, tools, string(response.get("stop_reason")) or None
    choice = next(iter(objects(response.get("choices"))), {})
    message = an_object(choice.get("message"))
    tools = [
        tool(t.get("id"), an_object(t.get("function")).get("name"), an_object(t.get("function")).get("arguments"))
        for t in objects(message.get("tool_calls"))
    ]
    return string(message.get("content")), tools, string(choice.get("finish_reason")) or None


# What an upstream sent is read as far as it has the API's shape, and no further: a part of another
# shape (a list where an object goes, a number where text goes) is read as absent, so that no reply
# can break the reading, and with it the recording, of the call that it answers.
def an_object(value: Any) -> dict[str, Any]:
    """VALUE when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def objects(value: Any) -> list[dict[str, Any]]:
    """The JSON objects in VALUE when it is a list, else none."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def string(value: Any) -> str:
    """VALUE when it is a string, else an empty one."""
    return value if isinstance(value, str) else ""


def index_of(value: Any, default: int) -> int:
    """A part's index when it is a whole number, else DEFAULT."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass(frozen=True)
class Usage:
    """What a call used, each kind of token apart, as its provider billed it. `input_tokens` counts every
    token of the prompt, those read from or written to the provider's prompt cache included (as OpenAI
    reports it, ATIF records it and genai-prices prices it); the cache's are parts of it."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0  # of input_tokens: read from the prompt cache
    cache_write_tokens: int = 0  # of input_tokens: written to it, at every lifetime
    cache_write_1h_tokens: int = 0  # of cache_write_tokens: kept an hour (Anthropic's; the rest five minutes)
    web_searches: int = 0  # searches the provider ran for the call, billed beside its tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @property
    def plain_input_tokens(self) -> int:
        """The prompt's tokens the cache had no part in."""
        return self.input_tokens - self.cache_read_tokens - self.cache_write_tokens

    def at_least(self, other: Usage) -> Usage:
        """Each kind of token the larger count of this usage's and OTHER's (the prompt then their sum):
        a stream's later count never lowers an earlier one."""
        plain, read = (
            max(self.plain_input_tokens, other.plain_input_tokens),
            max(self.cache_read_tokens, other.cache_read_tokens),
        )
        hour = max(self.cache_write_1h_tokens, other.cache_write_1h_tokens)
        written = max(self.cache_write_tokens, other.cache_write_tokens, hour)
        return Usage(
            plain + read + written,
            max(self.output_tokens, other.output_tokens),
            read,
            written,
            hour,
            max(self.web_searches, other.web_searches),
        )


def usage_of(body: Any) -> Usage | None:
    """The usage of a whole JSON response (or a stream's Anthropic message or Responses response);
    None when it reports none. A Responses response's web searches are its `web_search_call` items."""
    usage = tokens_of(body.get("usage") if isinstance(body, dict) else None)
    if usage is None or "output" not in body:
        return usage
    searches = sum(1 for item in objects(body.get("output")) if item.get("type") == "web_search_call")
    return replace(usage, web_searches=max(usage.web_searches, searches))


def tokens_of(usage: Any) -> Usage | None:
    """The tokens of a `usage` object, in any API's shape; None when it is not one.
    Chat Completions: prompt_tokens and completion_tokens, its cached tokens among the prompt's
    (`prompt_tokens_details.cached_tokens`). Responses: input_tokens and output_tokens, its cached
    tokens among the input's (`input_tokens_details.cached_tokens`). Anthropic: input_tokens and
    output_tokens, and the prompt's cached tokens apart from input_tokens (`cache_read_input_tokens`,
    `cache_creation_input_tokens`, split by lifetime in `cache_creation`), all of them read, so input
    too; the tokens of a server-side compaction apart from the rest (`iterations`), so added; its web
    searches (`server_tool_use.web_search_requests`).
    A usage whose counts are not whole numbers of at least 0 (a string, null, NaN, a negative one), or
    whose cached tokens are more than its prompt, is not one: the call is then charged an estimate,
    never nothing, never a credit."""
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage:  # Chat Completions
        return openai_usage(usage, "prompt_tokens", "completion_tokens", "prompt_tokens_details")
    if "input_tokens_details" in usage:  # Responses
        return openai_usage(usage, "input_tokens", "output_tokens", "input_tokens_details")
    return anthropic_usage(usage)


def openai_usage(usage: dict[str, Any], prompt_key: str, output_key: str, details_key: str) -> Usage | None:
    """An OpenAI usage (Chat Completions' or Responses'): its cached tokens are among its prompt's."""
    prompt, output = count_of(usage.get(prompt_key)), count_of(usage.get(output_key))
    cached = optional_count(an_object(usage.get(details_key)).get("cached_tokens"))
    if prompt is None or output is None or cached is None or cached > prompt:
        return None
    return Usage(prompt, output, cache_read_tokens=cached)


def anthropic_usage(usage: dict[str, Any]) -> Usage | None:
    """An Anthropic usage: its cached tokens apart from its input_tokens, a compaction's apart from the rest."""
    input_tokens, output_tokens = count_of(usage.get("input_tokens")), count_of(usage.get("output_tokens"))
    read, written = (optional_count(usage.get(k)) for k in CACHE_FIELDS)
    lifetimes = an_object(usage.get("cache_creation"))
    short, hour = (optional_count(lifetimes.get(k)) for k in CACHE_LIFETIMES)
    searches = web_searches_of(usage)
    counts = (input_tokens, output_tokens, read, written, short, hour, searches)
    if any(c is None for c in counts):
        return None
    input_tokens, output_tokens, read, written, short, hour, searches = (c or 0 for c in counts)
    written = max(written, short + hour)  # the lifetimes' split, if it says more than the total
    total = Usage(input_tokens + read + written, output_tokens, read, written, hour, searches)
    iterations = usage.get("iterations")
    for iteration in iterations if isinstance(iterations, list) else []:
        if isinstance(iteration, dict) and iteration.get("type") == "compaction":  # not in the top-level fields
            compaction = anthropic_usage({**iteration, "iterations": None})
            if compaction is None:
                return None
            total += compaction
    return total


CACHE_FIELDS = ("cache_read_input_tokens", "cache_creation_input_tokens")  # Anthropic's, apart from input_tokens
CACHE_LIFETIMES = ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")  # of cache_creation_input_tokens


def web_searches_of(usage: dict[str, Any]) -> int | None:
    """The web searches an Anthropic usage reports (`server_tool_use.web_search_requests`): absent, 0."""
    return optional_count(an_object(usage.get("server_tool_use")).get("web_search_requests"))


def count_of(value: Any) -> int | None:
    """A token count: a whole number of at least 0 (an integral float too), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None


def optional_count(value: Any) -> int | None:
    """A count a usage may leave out: absent or null is 0, else `count_of`."""
    return 0 if value is None else count_of(value)


TIER_FIELDS = ("service_tier", "speed")  # where a response says its tier: OpenAI's service_tier, Anthropic's speed


def tier_of(response: Any) -> dict[str, str]:
    """The tier a provider says it served a call at, by field (TIER_FIELDS), as it wrote it: OpenAI's
    `service_tier` at the top of a chat completion, of each chunk of its stream and of a Responses
    response (in a stream's events); Anthropic's `service_tier` and `speed` in its usage (a stream's
    message_start, or any event's usage). A stream's last word counts; a value that is not a string
    is none."""
    said: dict[str, str] = {}
    for event in response if isinstance(response, list) else [response]:
        event = an_object(event)
        for part in (event, an_object(event.get("response")), an_object(event.get("message"))):
            for holder in (part, an_object(part.get("usage"))):
                said.update({k: holder[k] for k in TIER_FIELDS if isinstance(holder.get(k), str)})
    return said


def delta_tokens_of(usage: Any, so_far: Usage | None) -> Usage | None:
    """The usage after an Anthropic stream's `message_delta`, whose usage is a running total: its
    output always, its input (cached tokens and compactions included) when it says it, as it grows
    past message_start's in a server-side tool loop, else SO_FAR's (message_start's; None when that
    reported none). None when it reports no count to trust."""
    output_tokens = count_of(usage.get("output_tokens")) if isinstance(usage, dict) else None
    if output_tokens is None:
        return None
    if usage.get("input_tokens") is None:
        searches = web_searches_of(usage)
        if so_far is None or searches is None:
            return None
        return replace(so_far, output_tokens=output_tokens, web_searches=max(so_far.web_searches, searches))
    total = tokens_of(usage)
    if total is None:
        return None
    return total.at_least(replace(so_far, output_tokens=0)) if so_far is not None else total


def streamed_reply(events: list[dict[str, Any]]) -> Reply:
    """An answer put together from its stream: Anthropic's content blocks and deltas, Chat
    Completions' chunks, or the whole response a Responses stream ends with (else, when it was cut
    short of it, its text and function calls so far)."""
    finished = [e.get("response") for e in events if e.get("type") == "response.completed"]
    if finished and isinstance(finished[-1], dict):  # Responses
        return responses_reply(finished[-1])
    texts: list[str] = []
    calls: dict[int, dict[str, Any]] = {}  # by the block's or the tool call's index
    stop: str | None = None
    for event in events:
        kind = event.get("type")
        if kind == "content_block_start":  # Anthropic: a tool_use block opens with its id and name
            block = an_object(event.get("content_block"))
            if block.get("type") == "tool_use":
                calls[index_of(event.get("index"), len(calls))] = {
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "json": "",
                }
        delta = an_object(event.get("delta"))
        if kind == "content_block_delta":
            index = index_of(event.get("index"), -1)
            if delta.get("type") == "input_json_delta" and index in calls:
                calls[index]["json"] += string(delta.get("partial_json"))
            texts.append(string(delta.get("text")))
        stop = string(delta.get("stop_reason")) or stop  # Anthropic's message_delta
        item = an_object(event.get("item"))
        if kind in ("response.output_item.added", "response.output_item.done") and item.get("type") == "function_call":
            calls[index_of(event.get("output_index"), len(calls))] = {  # Responses, cut short of its end
                "id": item.get("call_id"),
                "name": item.get("name"),
                "json": string(item.get("arguments")),
            }
        elif kind == "response.function_call_arguments.delta" and index_of(event.get("output_index"), -1) in calls:
            calls[event["output_index"]]["json"] += string(event.get("delta"))
        elif kind == "response.output_text.delta":
            texts.append(string(event.get("delta")))
        for choice in objects(event.get("choices")):  # Chat Completions
            chunk = an_object(choice.get("delta"))
            texts.append(string(chunk.get("content")))
            for part in objects(chunk.get("tool_calls")):
                call = calls.setdefault(index_of(part.get("index"), 0), {"id": None, "name": None, "json": ""})
                function = an_object(part.get("function"))
                call["id"] = part.get("id") or call["id"]
                call["name"] = function.get("name") or call["name"]
                call["json"] += string(function.get("arguments"))
            stop = string(choice.get("finish_reason")) or stop
    tools = [tool(c["id"], c["name"], c["json"] or "{}") for _, c in sorted(calls.items())]
    return "".join(texts), tools, stop


def responses_reply(response: dict[str, Any]) -> Reply:
    """The text, function calls and status of an OpenAI Responses response."""
    items = objects(response.get("output"))
    text = "".join(
        string(part.get("text"))
        for item in items
        if item.get("type") == "message"
        for part in objects(item.get("content"))
        if part.get("type") == "output_text"
    )
    tools = [
        tool(item.get("call_id"), item.get("name"), item.get("arguments"))
        for item in items
        if item.get("type") == "function_call"
    ]
    return text, tools, string(response.get("status")) or None


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
                    result = (
                        str(block.get("tool_use_id") or ""),
                        text_of(block.get("content")),
                        bool(block.get("is_error")),
                    )
                    found.append(result)
    return found


def text_of(content: Any) -> str:
    """A result's content as text: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content)
