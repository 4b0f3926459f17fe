"""The run's model connection: the metering proxy (mlrb/models/proxy.py) started for an
agent that calls models, charging the run's budget, and its calls as the run's events.

Every agent's model calls go through it, the built-in loop's as an outside program's, so there
is one account of tokens and dollars and one source of the model-call events (the trajectory's
`model_call` lines, the traces' CHAT_MODEL spans, the `llm.*` metrics): the harness's, not the
agent's. A model the provider says it does not have, when the config allows it, is the config's
fault: the agent ends the run with `ModelNotFound` (`model_not_found`), one line.
"""

from __future__ import annotations

import datetime
import json
import secrets
import threading
from typing import Any

from mlrb.core import events
from mlrb.core.budget import Budget
from mlrb.models.api_shapes import reply_of, tool_results_of
from mlrb.models.prices import retired_on
from mlrb.models.proxy import Call, MeteringProxy
from mlrb.models.request_rules import tier_name

PROXY_RETRIES = 6  # upstream tries after the first, for an agent that does not retry by itself
SET_MODEL = "set a model it serves with agent.options.model=NAME"
OPEN_AT_END = "open_at_run_end"  # the stop reason recorded for a call the run's end charged its hold


class ModelNotFound(RuntimeError):
    """The provider has no model the run's config names (a retired one, say): the config's fault,
    not the agent's. Raised by the agent once its run is over, it ends the run as an
    infrastructure error (mlrb/run.py), in one line: the model, where, and the models the
    config allows."""


def model_not_found(proxy: MeteringProxy | None, fix: str = SET_MODEL) -> ModelNotFound | None:
    """The run's configuration error when an upstream said it has no model the config allows
    (the proxy notes it: `MeteringProxy.missing_model`), else None. FIX says how to set another."""
    missing = getattr(proxy, "missing_model", None)
    if proxy is None or missing is None:
        return None
    allowed = sorted(proxy.upstreams[missing.provider].models or ())
    retired = retired_on(missing.provider, missing.model)
    when = ""
    if retired:
        past = retired <= datetime.date.today().isoformat()
        when = f"; {missing.provider} {'retired' if past else 'retires'} it on {retired}"
    said = " ".join(missing.message.split())[:300].rstrip(".")
    for upstream in proxy.upstreams.values():  # an upstream's words never show a key
        said = said.replace(upstream.api_key, "***") if len(upstream.api_key) >= 8 else said
    return ModelNotFound(
        f"the {missing.provider} API at {missing.base_url} has no model '{missing.model}' "
        f"(it answered 404: {said}){when}. The config allows {', '.join(allowed)} there: "
        f"{fix}"
    )


def start(agent: Any, network_allowed: bool = False) -> MeteringProxy | None:
    """The run's proxy, for an agent that asks for one (its `model_upstreams()`: the providers it
    may call; None: it calls no model); None for the others. An agent that retries by itself
    (`proxy_retries = 0`) gets a proxy that does not, so each try is one call of its own; None
    takes the proxy's default. (mlrb.agents.base.Agent declares both.)"""
    upstreams = agent.model_upstreams()
    if upstreams is None:
        return None
    retries = PROXY_RETRIES if agent.proxy_retries is None else agent.proxy_retries
    # The token the agent uses as its key: worth nothing outside this run's proxy.
    return MeteringProxy(
        upstreams,
        secrets.token_urlsafe(24),
        meter=None,
        unix_socket=True,
        max_retries=retries,
        network_allowed=network_allowed,
    )


def attach(proxy: MeteringProxy, budget: Budget, sink: events.EventSink, tools: bool = False) -> CallEvents:
    """Charge the run's budget (the proxy refuses calls once it is spent) and emit each call as
    the run's events; with `tools`, the tool calls seen in them too, for an agent that does not
    emit its own. Until this, every call is refused."""
    calls = CallEvents(sink, budget, keys=[u.api_key for u in proxy.upstreams.values()], tools=tools)
    proxy.on_call = calls.emit
    proxy.meter = budget
    return calls


class CallEvents:
    """The proxy's calls as the run's events, from the proxy's threads (one at a time), at the
    step the budget has counted. A call is emitted whole once it is over: a program may call
    from several threads at once, and the proxy reports each call before its answer completes,
    so an agent that waits on its answer sees its events in their place.

    With `tools`, each tool call the model asks for is an event too, seen from the calls alone:
    asked in one call's answer (its id, name and arguments), answered in a later call's request
    (its output, and whether it failed). Both are emitted when the answer comes, just before the
    call that carries it, the span starting when the tool was asked for. The exit code is not
    seen; a tool whose result never comes back (the agent ended first) is only in its call's
    `tool_calls`.

    `models_used` names every model the upstreams were asked for (a call that went upstream),
    each with where its price comes from: the run records which models it used."""

    def __init__(self, sink: events.EventSink, budget: Budget, keys: list[str] | None = None, tools: bool = False):
        self.sink, self.budget, self.tools = sink, budget, tools
        self.models_used: dict[str, str] = {}  # model -> its price's source (mlrb/models/prices.py)
        self.asked: dict[str, tuple[dict[str, Any], int]] = {}  # tool call id -> (the call, when it was asked for)
        self.keys = [k for k in keys or [] if len(k) >= 8]  # the real keys: an upstream's error may quote one
        self.lock = threading.Lock()
        self.previous: dict[str, Any] = {}  # the last answered request of each conversation, to record what is new

    def emit(self, call: Call) -> None:
        """The call's events; a recording failure is raised to the agent at its next event."""
        with self.lock:
            try:
                self.events_of(call)
            except BaseException as e:
                self.sink.defer(e)

    def events_of(self, call: Call) -> None:
        if (call.attempts or call.open_at_end) and call.price is not None:  # it went upstream
            self.models_used.setdefault(call.model, call.price.source)
        step = self.budget.steps
        attempt = call.agent_attempt or max(call.attempts, 1)
        conversation = conversation_of(call)
        request = new_in(call.request, self.previous.get(conversation))
        if self.tools:  # the results among the conversation's new turns
            self.answered(step, call, [turn for key in CONVERSATION_KEYS for turn in request.get("new_" + key, [])])
        if call.status == 200:  # a retry records what its failed try did
            self.previous[conversation] = call.request
        self.sink.emit(
            events.ModelCallStarted(
                step, attempt, call.provider, call.model, call.timeout_s or 0.0, request, started_ns=call.started_ns
            )
        )
        if call.status != 200 and not call.open_at_end:
            self.sink.emit(events.ModelCallFailed(step, attempt, self.redact(failure(call))))
            return
        text, tool_calls, stop_reason = reply_of(call.response, call.stream)
        if call.open_at_end:  # the run ended before its answer did: charged what it held
            stop_reason = stop_reason or OPEN_AT_END
        used, charge = call.usage, call.charge
        cost = events.Cost(
            used.input_tokens,
            used.output_tokens,
            call.estimated,
            charge.input_usd,
            charge.output_usd,
            used.cache_read_tokens,
            used.cache_write_tokens,
            used.cache_write_1h_tokens,
            charge.fee_usd,
            used.web_searches,
            tier_name(call.tier),
        )
        self.sink.emit(
            events.ModelCalled(
                step, attempt, call.model, call.latency_s, self.redact(text), tool_calls, stop_reason, cost
            )
        )
        b = self.budget  # the proxy has charged it already
        self.sink.emit(events.BudgetState(step, b.input_tokens, b.output_tokens, b.usd))
        if self.tools:
            answered_ns = call.started_ns + int(call.latency_s * 1e9)
            self.asked.update({t["id"]: (t, answered_ns) for t in tool_calls if t["id"]})

    def answered(self, step: int, call: Call, turns: list[Any]) -> None:
        """The tool calls this call's new TURNS answer, each as a tool call and its result."""
        for call_id, output, failed in tool_results_of(turns):
            if call_id not in self.asked:
                continue
            asked, asked_ns = self.asked.pop(call_id)
            duration_s = max(0.0, (call.started_ns - asked_ns) / 1e9)
            self.sink.emit(events.ToolStarted(step, asked["name"], call_id, asked["arguments"], asked_ns))
            self.sink.emit(
                events.ToolEnded(step, asked["name"], call_id, failed, None, duration_s, self.redact(output))
            )

    def redact(self, text: str) -> str:
        for key in self.keys:
            text = text.replace(key, "***")
        return text


def failure(call: Call) -> str:
    """What went wrong with a call, as the agent was told it."""
    if call.refused:
        return call.refused
    error = call.response.get("error") if isinstance(call.response, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return f"HTTP {call.status}: {message}" if message else f"HTTP {call.status}"


# The conversation's fields, per API: an agent sends the whole conversation with every call.
CONVERSATION_KEYS = ("messages", "input")


def conversation_of(call: Call) -> str:
    """Which conversation a call continues: its endpoint and its first turn (an agent may hold
    several at once, as Claude Code's side calls and subagents do)."""
    turns = next((call.request[k] for k in CONVERSATION_KEYS if isinstance(call.request.get(k), list)), None)
    return call.endpoint + "\n" + json.dumps(turns[0] if turns else None, sort_keys=True)


def new_in(request: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """What a trace records of a call: its settings, and of the conversation only the turns that
    are new since the previous call (when that call's turns begin this one's), with its size.
    Traces then grow with the run, not with its square. Unchanged instructions and tool
    schemas are left out after the first call."""
    recorded: dict[str, Any] = {}
    for key, value in request.items():
        before = previous.get(key) if previous is not None else None
        if key in CONVERSATION_KEYS and isinstance(value, list):
            kept = before if isinstance(before, list) and value[: len(before)] == before else []
            recorded["new_" + key] = value[len(kept) :]
            recorded["conversation"] = {"turns": len(value), "chars": len(json.dumps(value))}
        elif key in ("system", "instructions", "tools") and value == before:
            continue  # the same as the previous call's
        else:
            recorded[key] = value
    return recorded
