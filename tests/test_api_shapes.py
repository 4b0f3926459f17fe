"""What the harness reads of the model APIs' messages (mlrb/models/api_shapes.py): a call's text, tool
calls and stop reason, whole or streamed, and the tool results an agent sends back, in the
shapes the scripted upstream (tests/fake_llm_server.py) writes as the real APIs do."""

from __future__ import annotations

import math

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
from mlrb.models.api_shapes import Usage, delta_tokens_of, reply_of, tokens_of, tool_results_of, usage_of
from mlrb.models.proxy import StreamUsage

pytestmark = pytest.mark.fast

TURN = reply(tool("bash", command="ls -l"), tool("read_file", path="a.txt"), text="Looking.")


def streamed(events: list[bytes]) -> list:
    """A stream's events as the proxy keeps them."""
    reader = StreamUsage()
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


# A call's tokens, as Anthropic reports a prompt partly written to and read from its cache: all 1234 were read.
CACHED = {"input_tokens": 1000, "cache_creation_input_tokens": 200, "cache_read_input_tokens": 34, "output_tokens": 56}


@pytest.mark.parametrize("shape", WHOLE)
def test_the_proxy_and_the_agents_providers_read_a_calls_tokens_alike(shape):
    """One reading of usage (api_shapes.tokens_of): the proxy's, of the JSON whole or streamed, and the
    built-in agent's providers', of the SDK's objects, give the same numbers for every shape."""
    import anthropic.types
    import openai.types.chat

    from mlrb.models.providers import tokens_of

    body = {**WHOLE[shape], "usage": CACHED} if shape == "anthropic" else WHOLE[shape]
    whole = usage_of(body)
    reader = StreamUsage()
    asked = {"stream": True, "stream_options": {"include_usage": True}}  # as the proxy asks a chat stream
    reader.feed(b"".join(openai_chunks(WHOLE[shape], asked) if shape == "chat" else STREAMS[shape]))
    assert reader.usage == usage_of(WHOLE[shape])  # the stream's, as its body's
    sdk = {"anthropic": anthropic.types.Message, "chat": openai.types.chat.ChatCompletion}.get(shape)
    if sdk is not None:  # the built-in agent speaks these two
        assert tokens_of(sdk.model_validate(body).usage) == (whole.input_tokens, whole.output_tokens)
    expected = (
        Usage(1234, 56, cache_read_tokens=34, cache_write_tokens=200) if shape == "anthropic" else Usage(1000, 100)
    )
    assert whole == expected
    assert usage_of({**body, "usage": None}) is None and tokens_of(None) == (None, None)


# Each API's usage of one call whose prompt was partly cached, as the API reports it: 200,000 tokens read
# from the cache, and (Anthropic) 3,000 written to it, 1,000 for five minutes and 2,000 for an hour.
CACHED_USAGE = {
    "anthropic": {"input_tokens": 100, "cache_read_input_tokens": 200_000, "cache_creation_input_tokens": 3000,
                  "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
                  "output_tokens": 100},
    "chat": {"prompt_tokens": 200_100, "completion_tokens": 100, "total_tokens": 200_200,
             "prompt_tokens_details": {"cached_tokens": 200_000, "audio_tokens": 0}},
    "responses": {"input_tokens": 200_100, "output_tokens": 100, "total_tokens": 200_200,
                  "input_tokens_details": {"cached_tokens": 200_000}, "output_tokens_details": {"reasoning_tokens": 0}},
}  # fmt: skip
READ_AS = {
    "anthropic": Usage(203_100, 100, cache_read_tokens=200_000, cache_write_tokens=3000, cache_write_1h_tokens=2000),
    "chat": Usage(200_100, 100, cache_read_tokens=200_000),  # OpenAI counts its cached tokens within the prompt's
    "responses": Usage(200_100, 100, cache_read_tokens=200_000),
}
RENDER = {"anthropic": (anthropic_reply, anthropic_events), "chat": (openai_reply, None),
          "responses": (responses_reply, responses_events)}  # fmt: skip


@pytest.mark.parametrize("api", CACHED_USAGE)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_calls_cached_tokens_are_read_apart_and_counted_once(api, stream):
    """The prompt's tokens read from and written to the cache are kept apart from the rest, each
    lifetime's writes too; OpenAI's cached tokens, which sit inside its input count, are not counted
    twice; Anthropic's, which sit beside it, are added to it."""
    render, events = RENDER[api]
    body = render(reply(text="Done.", usage=CACHED_USAGE[api]), "m", 1)
    if stream:
        reader = StreamUsage()
        chunks = openai_chunks(body, {"stream": True, "stream_options": {"include_usage": True}}) if events is None \
            else events(body)  # fmt: skip
        reader.feed(b"".join(chunks))
        assert reader.final
        assert reader.usage == READ_AS[api]
    else:
        assert usage_of(body) == READ_AS[api]


BAD_CACHE_COUNTS = {  # a usage that is not one: the call is charged an estimate, never less
    "anthropic negative cache read": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": -10**9},
    "anthropic negative cache write": {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": -1},
    "anthropic negative hour's writes": {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 10,
                                         "cache_creation": {"ephemeral_1h_input_tokens": -10}},
    "anthropic a string cache read": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": "many"},
    "chat negative cached": {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": -5}},
    "chat more cached than the prompt": {"prompt_tokens": 10, "completion_tokens": 5,
                                         "prompt_tokens_details": {"cached_tokens": 11}},
    "responses more cached than the input": {"input_tokens": 10, "output_tokens": 5,
                                             "input_tokens_details": {"cached_tokens": 10**12}},
    "responses NaN cached": {"input_tokens": 10, "output_tokens": 5, "input_tokens_details": {"cached_tokens": math.nan}},
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_CACHE_COUNTS)
def test_a_cache_count_that_cannot_be_true_makes_no_usage(case):
    assert tokens_of(BAD_CACHE_COUNTS[case]) is None


def test_counts_that_disagree_are_read_as_the_larger_never_the_smaller():
    """Anthropic's split of its cache writes by lifetime saying more than their total: the split
    counts. A stream's later count lower than its first: the first stands."""
    split = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 100,
             "cache_creation": {"ephemeral_5m_input_tokens": 300, "ephemeral_1h_input_tokens": 200}}  # fmt: skip
    assert tokens_of(split) == Usage(510, 5, cache_write_tokens=500, cache_write_1h_tokens=200)
    start = tokens_of({"input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 5000})
    later = delta_tokens_of({"input_tokens": 10, "output_tokens": 50, "cache_creation_input_tokens": 3000}, start)
    assert later == Usage(8010, 50, cache_read_tokens=5000, cache_write_tokens=3000)
    assert delta_tokens_of({"output_tokens": 50}, start) == Usage(5010, 50, cache_read_tokens=5000)
