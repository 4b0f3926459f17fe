"""What the harness reads of the model APIs' messages (mlrb/api_shapes.py): a call's text, tool
calls and stop reason, whole or streamed, and the tool results an agent sends back, in the
shapes the scripted upstream (tests/fake_llm_server.py) writes as the real APIs do."""

from __future__ import annotations

import pytest

from fake_llm_server import (
    anthropic_events,
    anthropic_reply,
    openai_chunks,
    openai_reply,
    reply,
    responses_events,
    responses_reply,
    tool,
)
from mlrb.api_shapes import reply_of, tool_results_of
from mlrb.proxy import StreamUsage

pytestmark = pytest.mark.fast

TURN = reply(tool("bash", command="ls -l"), tool("read_file", path="a.txt"), text="Looking.")


def streamed(events: list[bytes]) -> list:
    """A stream's events as the proxy keeps them."""
    reader = StreamUsage("anthropic")
    reader.feed(b"".join(events))
    return reader.events


WHOLE = {
    "anthropic": anthropic_reply(TURN, "m", 1),
    "chat": openai_reply(TURN, "m", 1),
    "responses": responses_reply(TURN, "m", 1),
}
STREAMS = {
    "anthropic": anthropic_events(WHOLE["anthropic"]),
    "chat": openai_chunks(WHOLE["chat"], {"stream": True}),
    "responses": responses_events(WHOLE["responses"]),
}


@pytest.mark.parametrize("api", sorted(WHOLE))
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_call_s_text_and_tool_calls_are_read_whole_or_streamed(api, stream):
    response = streamed(STREAMS[api]) if stream else WHOLE[api]
    text, tools, stop = reply_of(response, stream)
    assert text == "Looking."
    assert [(t["name"], t["arguments"]) for t in tools] == [
        ("bash", {"command": "ls -l"}),
        ("read_file", {"path": "a.txt"}),
    ]
    assert all(t["id"] for t in tools) and len({t["id"] for t in tools}) == 2
    assert stop in ("tool_use", "tool_calls", "completed")
    # The ids are the ones the agent answers with: the same whether streamed or not.
    assert [t["id"] for t in tools] == [t["id"] for t in reply_of(WHOLE[api], False)[1]]


def test_tool_results_are_read_from_each_api_s_request():
    anthropic = [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "total 0", "is_error": False},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "no such file"}],
         "is_error": True},
        {"type": "text", "text": "[budget]"}]}]  # fmt: skip
    chat = [{"role": "assistant", "content": None}, {"role": "tool", "tool_call_id": "call_1", "content": "total 0"}]
    responses = [{"type": "function_call", "call_id": "call_9"}, {"type": "function_call_output", "call_id": "call_9",
                                                                   "output": "total 0"}]  # fmt: skip
    assert tool_results_of(anthropic) == [("toolu_1", "total 0", False), ("toolu_2", "no such file", True)]
    assert tool_results_of(chat) == [("call_1", "total 0", False)]
    assert tool_results_of(responses) == [("call_9", "total 0", False)]
    assert tool_results_of(["not a turn", {"role": "user", "content": "plain text"}]) == []


def test_arguments_that_are_not_json_are_kept_as_they_came():
    body = {"choices": [{"message": {"content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{not json"}}]},
        "finish_reason": "tool_calls"}]}  # fmt: skip
    assert reply_of(body, False)[1] == [{"id": "c", "name": "bash", "arguments": {"raw": "{not json"}}]
