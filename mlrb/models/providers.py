"""Model APIs behind one small interface: the conversation kept in a neutral
form, and one adapter per wire format (Anthropic Messages, OpenAI Chat
Completions) that translates messages, tool schemas, tool calls and usage.

The SDKs are imported inside the adapters, only when a run starts: checking a
config must not import them. The SDKs' own retries are off: they would retry inside
one call, past the wall time left and unseen. The agent retries each call by its
config's policy (mlrb/core/retries.py), each try bounded by the budget and recorded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mlrb.models import api_shapes

# Sent when a server needs no key (a local model server): the OpenAI SDK refuses an empty one.
NO_KEY = "no-key-needed"


class Tool(Protocol):
    """What an API is told of a tool the model may call (the agent's tools have this, and how to run it)."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def parameters(self) -> dict[str, Any]: ...  # JSON schema of the arguments object


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]
    # Set when the model's arguments were not a JSON object: the call is answered with this error.
    error: str | None = None


@dataclass
class ToolResult:
    call_id: str
    content: str
    is_error: bool = False


@dataclass
class Message:
    """One turn: the user's (instructions, tool results, budget notes) or the assistant's."""

    role: str
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)


@dataclass
class Reply:
    text: str
    tool_calls: list[ToolCall]
    stop_reason: str
    # From the API's reported usage; None when the server reported none.
    input_tokens: int | None
    output_tokens: int | None


class ApiError(Exception):
    """A failed API call. `status`: the HTTP status the server answered with, if any (the agent's
    retry_statuses say which are retried). `transient`, for failures without a status: whether
    trying again may help (a lost connection, a timeout, a reply that is not the API's)."""

    def __init__(self, message: str, status: int | None, transient: bool = False, retry_after_s: float | None = None):
        super().__init__(message)
        self.status = status
        self.transient = transient
        self.retry_after_s = retry_after_s


def tokens_of(usage: Any) -> tuple[int | None, int | None]:
    """(input tokens, output tokens) of an SDK reply's usage, read as the metering proxy reads the same
    JSON (mlrb/models/api_shapes.py); (None, None) when the server reported none."""
    tokens = api_shapes.tokens_of(usage.model_dump() if usage is not None else None)
    return (tokens.input_tokens, tokens.output_tokens) if tokens is not None else (None, None)


def retry_after(headers: Any) -> float | None:
    """The server's Retry-After (seconds form), when it sent one."""
    try:
        value = headers.get("retry-after") if headers is not None else None
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def api_error(provider: str, endpoint: str, e: Exception, status_error: type, connection_error: type) -> ApiError:
    """Translate an SDK exception (both SDKs have the same hierarchy) into an ApiError
    naming the endpoint (the base URL: a wrong one is the usual cause)."""
    if isinstance(e, status_error):
        status = int(getattr(e, "status_code", 0) or 0)
        detail = describe_error_body(getattr(e, "body", None)) or str(e)
        response = getattr(e, "response", None)
        return ApiError(
            f"{provider} API error at {endpoint}: HTTP {status}: {detail}",
            status,
            retry_after_s=retry_after(getattr(response, "headers", None)),
        )
    if isinstance(e, connection_error):
        return ApiError(f"{provider} API unreachable at {endpoint}: {type(e).__name__}: {e}", None, True)
    if "json" in f"{type(e).__name__} {e}".lower():  # a 200 whose body the SDK could not decode
        return malformed_reply(provider, endpoint, str(e))
    return ApiError(f"{provider} API call failed at {endpoint}: {type(e).__name__}: {e}", None, False)


def malformed_reply(provider: str, endpoint: str, body: Any) -> ApiError:
    """A server that answered but not with an API reply (an HTML error page, a proxy's
    text, a truncated body). Retried like a server error: such glitches pass; if it keeps
    answering so, the agent fails after its retries and its workspace is still scored."""
    snippet = " ".join(str(body).split())[:200] or "(empty)"
    return ApiError(
        f"{provider} API at {endpoint} answered with something that is not an API reply: {snippet}", None, True
    )


def endpoint_of(client: Any) -> str:
    return str(getattr(client, "base_url", "") or "?").rstrip("/")


def describe_error_body(body: Any) -> str:
    # Anthropic's body is {"type": "error", "error": {...}}; the OpenAI SDK keeps only the inner object.
    error = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(error, dict):
        kind, message = error.get("type") or error.get("code"), error.get("message")
        return f"{kind}: {message}" if kind else str(message)
    return ""


def parse_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """Tool arguments as a dict; OpenAI sends a JSON string that a model may get wrong."""
    if isinstance(raw, dict):
        return raw, None
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError as e:
        return {}, f"the arguments are not valid JSON ({e}); send a JSON object"
    if not isinstance(value, dict):
        return {}, "the arguments must be a JSON object"
    return value, None


class AnthropicProvider:
    """The Anthropic Messages API (POST /v1/messages)."""

    name = "anthropic"

    def __init__(self, api_key: str, base_url: str | None, temperature: float | None, shown_as: str | None = None):
        import anthropic

        self.sdk = anthropic
        # base_url None: the SDK reads ANTHROPIC_BASE_URL, else uses its default.
        # Its own OpenTelemetry spans are off: MLflow traces every call already.
        self.client = anthropic.Anthropic(api_key=api_key, base_url=base_url, max_retries=0, open_telemetry=False)
        self.temperature = temperature
        # The endpoint errors name: the upstream's, when the client talks to it through the run's proxy.
        self.shown_as = shown_as

    def request(self, model: str, system: str, history: list[Message], tools: Sequence[Tool], max_tokens: int) -> dict:
        return {
            "model": model,
            "max_tokens": max_tokens,
            "system": system,
            "messages": [wire for m in history for wire in self.wire(m)],
            "tools": [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools],
        }

    def wire(self, m: Message) -> list[dict]:
        """The API messages of one turn (here always one)."""
        if m.role == "assistant":
            content: list[dict] = [{"type": "text", "text": m.text}] if m.text else []
            content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in m.tool_calls]
            return [{"role": "assistant", "content": content or [{"type": "text", "text": "(no reply)"}]}]
        content = [
            {"type": "tool_result", "tool_use_id": r.call_id, "content": r.content, "is_error": r.is_error}
            for r in m.tool_results
        ]
        if m.text:
            content.append({"type": "text", "text": m.text})
        return [{"role": "user", "content": content}]

    def call(self, request: dict, timeout_s: float, headers: dict[str, str] | None = None) -> Reply:
        # This SDK has no `temperature` argument any more; older models still take it in the body.
        extra = {"temperature": self.temperature} if self.temperature is not None else None
        endpoint = self.shown_as or endpoint_of(self.client)
        try:
            response = self.client.messages.create(
                **request, timeout=timeout_s, extra_body=extra, extra_headers=headers
            )
        except self.sdk.APIError as e:
            raise api_error(self.name, endpoint, e, self.sdk.APIStatusError, self.sdk.APIConnectionError) from None
        except ValueError as e:  # a body that is not JSON, with a JSON content type
            raise malformed_reply(self.name, endpoint, e) from None
        try:
            return self.reply(response)
        except (AttributeError, TypeError, KeyError, ValueError):
            raise malformed_reply(self.name, endpoint, response) from None

    def reply(self, response: Any) -> Reply:
        text, calls = [], []
        for block in response.content:
            if block.type == "text":
                text.append(block.text)
            elif block.type == "tool_use":
                calls.append(ToolCall(block.id, block.name, dict(block.input)))
        input_tokens, output_tokens = tokens_of(response.usage)
        return Reply(
            text="\n".join(text),
            tool_calls=calls,
            stop_reason=str(response.stop_reason),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )


class OpenAIProvider:
    """OpenAI Chat Completions (POST {base_url}/chat/completions): OpenAI, vLLM, Ollama, llama.cpp..."""

    name = "openai"

    def __init__(
        self,
        api_key: str,
        base_url: str | None,
        temperature: float | None,
        max_tokens_param: str,
        seed: int,
        shown_as: str | None = None,
    ):
        import openai

        self.sdk = openai
        # base_url None: the SDK reads OPENAI_BASE_URL, else uses its default.
        self.client = openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=0)
        self.temperature = temperature
        # The endpoint errors name: the upstream's, when the client talks to it through the run's proxy.
        self.shown_as = shown_as
        self.max_tokens_param = max_tokens_param
        self.seed = seed

    def request(self, model: str, system: str, history: list[Message], tools: Sequence[Tool], max_tokens: int) -> dict:
        messages: list[dict] = [{"role": "system", "content": system}]
        for m in history:
            messages += self.wire(m)
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "tools": [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ],
            self.max_tokens_param: max_tokens,
            "seed": self.seed,
        }
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    def wire(self, m: Message) -> list[dict]:
        """The API messages of one turn: tool results are messages of their own here."""
        if m.role == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                    for c in m.tool_calls
                ]
            return [message]
        out = [{"role": "tool", "tool_call_id": r.call_id, "content": r.content} for r in m.tool_results]
        if m.text:
            out.append({"role": "user", "content": m.text})
        return out

    def call(self, request: dict, timeout_s: float, headers: dict[str, str] | None = None) -> Reply:
        endpoint = self.shown_as or endpoint_of(self.client)
        try:
            response = self.client.chat.completions.create(**request, timeout=timeout_s, extra_headers=headers)
        except self.sdk.APIError as e:
            raise api_error(self.name, endpoint, e, self.sdk.APIStatusError, self.sdk.APIConnectionError) from None
        except ValueError as e:  # a body that is not JSON, with a JSON content type
            raise malformed_reply(self.name, endpoint, e) from None
        if getattr(response, "choices", None) == []:
            raise ApiError(f"{self.name} API at {endpoint} returned no choices", None, True)
        try:
            return self.reply(response)
        except (AttributeError, TypeError, KeyError, ValueError, IndexError):
            raise malformed_reply(self.name, endpoint, response) from None

    def reply(self, response: Any) -> Reply:
        choice = response.choices[0]
        calls = []
        for call in choice.message.tool_calls or []:
            function = getattr(call, "function", None)
            if function is None:  # a custom (non-function) tool call: none are offered
                continue
            arguments, error = parse_arguments(function.arguments)
            calls.append(ToolCall(call.id, function.name, arguments, error))
        input_tokens, output_tokens = tokens_of(response.usage)
        return Reply(
            text=choice.message.content or "",
            tool_calls=calls,
            stop_reason=str(choice.finish_reason),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )
