"""An LLM agent: a model that plans, edits files, runs code in the sandbox, reads
the output, iterates and submits, through native tool calling.

The loop runs in the harness process. Each step is one model call, then the
tool calls it asked for, executed in the run's sandbox. Its calls go through the run's
metering proxy (mlrb/models/metering.py), as every agent's do: the proxy holds the real key,
charges the budget from the API's reported usage and emits each call as the run's events.
The loop bounds every call by the budget: the remaining wall time is the call's timeout
(the proxy gives up upstream at it), the remaining output tokens cap its length, and any
limit reached stops the run cleanly. It retries failed calls by its config's policy (the
proxy, started with `proxy_retries = 0`, does not) and emits its steps, retries and tool
calls as events (mlrb/core/events.py) to the run's sink, whose subscribers write the trajectory,
the MLflow traces and the metrics. A provider that has no such model (a retired one) ends
the run as a configuration error, not the agent's (metering.ModelNotFound).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from omegaconf import MISSING, OmegaConf

from mlrb.agents import conversation
from mlrb.agents.base import Agent, AgentContext, AgentOutcome
from mlrb.agents.tools import SUBMIT, TOOLS, ToolEnv, ToolOutput, run_tool
from mlrb.core import events
from mlrb.core.budget import Budget
from mlrb.core.config import AgentConfig, ConfigError, check_positive, describe_omegaconf_error
from mlrb.core.retries import Backoff, RetryState
from mlrb.core.status import Status
from mlrb.models import metering, prices
from mlrb.models.providers import NO_KEY, ApiError, Message, Reply, ToolCall, ToolResult
from mlrb.models.proxy import ATTEMPT_HEADER, PROVIDERS, TIMEOUT_HEADER, Upstream, upstream_url

log = logging.getLogger(__name__)

# The proxy answers a call it gave up on (504) this long before the SDK would give up itself.
PROXY_GRACE_S = 5.0
MAX_TOKENS_PARAMS = ("max_completion_tokens", "max_tokens")
# Tool outputs and arguments shorter than this are never elided: the gain would be nil.
ELIDE_MIN_CHARS = 200
# Retried by default: timeout, conflict, rate limit, and every server error (529 is Anthropic's "overloaded").
RETRY_STATUSES = ("408", "409", "429", "5xx")
STATUS_PATTERN = re.compile(r"[1-5]([0-9]{2}|xx)")


class NoTimeLeft(Exception):
    """The wall time ran out before a model call could start."""


def status_matches(status: int, pattern: str) -> bool:
    """`pattern` is an HTTP status ("429") or a class of them ("5xx")."""
    return str(status) == pattern or (pattern.endswith("xx") and str(status)[0] == pattern[0])


@dataclass
class LlmOptions:
    """`agent.options` of an LLM agent (mlrb/conf/agent/claude.yaml, gpt4o.yaml, openai_compatible.yaml)."""

    # Wire format: "anthropic" (Messages API) or "openai" (Chat Completions, also local servers).
    provider: str = MISSING
    # The model's name at the provider.
    model: str = MISSING
    # Environment variable holding the API key; null for a server that needs none.
    api_key_env: str | None = None
    # null: the SDK's own variable (ANTHROPIC_BASE_URL / OPENAI_BASE_URL), else the vendor's API.
    base_url: str | None = None
    # null: the API's default.
    temperature: float | None = None
    # The most output tokens one call may ask for.
    max_tokens_per_call: int = 4096
    # OpenAI format only: the name of the output cap (older servers know only max_tokens).
    max_tokens_param: str = "max_completion_tokens"
    # USD per million tokens, for the cost the budget is checked against. null: the price table's
    # (mlrb/models/prices.py); a number overrides it, and a model the table lacks needs both.
    price_input_per_mtok: float | None = None
    price_output_per_mtok: float | None = None
    # USD per million tokens of the prompt read from the provider's cache, written to it (five
    # minutes), written to Anthropic's one-hour cache. null: the table's; with both rates above
    # set, the input rate.
    price_cache_read_per_mtok: float | None = None
    price_cache_write_per_mtok: float | None = None
    price_cache_write_1h_per_mtok: float | None = None
    # USD per 1,000 web searches the provider runs for a call (billed beside tokens). null: the table's;
    # a model with neither may not be offered the provider's web search.
    price_per_1k_web_searches: float | None = None
    # Longest one API call may take (the remaining wall time may cut it shorter).
    request_timeout_s: float = 600.0
    # Failed calls are retried this often, waiting retry_base_delay_s * 2^(n-1) before the
    # n-th retry (longer if the server asks for it), at most retry_max_delay_s.
    max_retries: int = 6
    # The first retry's wait, in seconds; it doubles each time.
    retry_base_delay_s: float = 2.0
    # The longest wait between two tries, in seconds.
    retry_max_delay_s: float = 60.0
    # The HTTP statuses retried ("5xx": every server error). Lost connections, timeouts and
    # replies that are not the API's are always retried; other errors never are.
    retry_statuses: list[str] = dataclasses.field(default_factory=lambda: list(RETRY_STATUSES))
    # Characters of conversation kept; beyond it the oldest tool outputs are elided.
    context_chars: int = 400_000
    # Longest tool output the model reads (longer ones are cut in the middle).
    tool_output_chars: int = 20_000
    # Timeout of a command when the model gives none.
    command_timeout_s: float = 900.0


def parse_options(cfg: AgentConfig) -> LlmOptions:
    """The typed options, or a one-line ConfigError naming the bad one."""
    from omegaconf.errors import OmegaConfBaseException

    names = [f.name for f in dataclasses.fields(LlmOptions)]
    unknown = sorted(set(cfg.options) - set(names))
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f"; did you mean 'agent.options.{close[0]}'?" if close else ""
        raise ConfigError(
            f"unknown option 'agent.options.{unknown[0]}' for agent {cfg.name}{hint} Valid options: {', '.join(names)}"
        )
    try:
        options = cast(LlmOptions, OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(LlmOptions), cfg.options)))
    except OmegaConfBaseException as e:
        raise ConfigError(describe_omegaconf_error(e, prefix="agent.options.")) from None
    check_values(options)
    return options


def check_values(o: LlmOptions) -> None:
    if o.provider not in PROVIDERS:
        raise ConfigError(f"unknown agent.options.provider '{o.provider}'; valid choices: {', '.join(PROVIDERS)}")
    if o.max_tokens_param not in MAX_TOKENS_PARAMS:
        raise ConfigError(
            f"unknown agent.options.max_tokens_param '{o.max_tokens_param}'; valid choices: {', '.join(MAX_TOKENS_PARAMS)}"
        )
    positive = ("max_tokens_per_call", "request_timeout_s", "context_chars", "tool_output_chars", "command_timeout_s")
    not_negative = ("max_retries", "retry_base_delay_s", "retry_max_delay_s")
    optional = ("temperature", *prices.CONFIG_KEYS)
    for key in positive:
        check_positive(f"agent.options.{key}", getattr(o, key))
    for key in not_negative + tuple(k for k in optional if getattr(o, k) is not None):
        value = getattr(o, key)
        if not math.isfinite(value) or value < 0:  # a NaN price would make every call free
            raise ConfigError(f"agent.options.{key} must not be negative, got {value}: give a finite number, 0 or more")
    bad = [p for p in o.retry_statuses if not STATUS_PATTERN.fullmatch(p)]
    if bad:
        raise ConfigError(
            f"agent.options.retry_statuses has '{bad[0]}': give HTTP statuses such as 429, or a class such as 5xx"
        )
    if o.api_key_env is not None and not o.api_key_env.strip():
        raise ConfigError("agent.options.api_key_env is empty: name an environment variable, or null for no key")


def price_of(options: LlmOptions) -> prices.Price:
    """The model's price: the config's, else the price table's; a one-line ConfigError when neither has one."""
    rates = prices.config_rates(options)
    return prices.price_of(
        options.provider,
        options.model,
        rates.pop("input_per_mtok"),
        rates.pop("output_per_mtok"),
        "agent.options",
        **rates,
    )


def read_api_key(cfg: AgentConfig, options: LlmOptions) -> str | None:
    if options.api_key_env is None:
        return None
    key = os.environ.get(options.api_key_env, "").strip()
    if not key:
        raise ConfigError(
            f"agent {cfg.name} needs an API key: set the environment variable {options.api_key_env} "
            "(or name another with agent.options.api_key_env)"
        )
    return key


def system_prompt(ctx: AgentContext) -> str:
    return (
        "You are an AI research agent solving a machine-learning research task on your own.\n"
        f"Your working directory is your workspace, {ctx.sandbox.workspace}: every command runs there and "
        "every relative path is inside it. The task's data is read-only, in $MLRB_DATA "
        f"({ctx.sandbox.data_dir}).\n"
        "Act through the tools: bash (shell commands), run_python, read_file, write_file, edit_file "
        "(exact replacement), list_files, and submit when you are done. Each call's result comes back to you; "
        "read it before deciding the next step. Commands have timeouts; long outputs are cut in the middle; "
        "old tool outputs are elided from the conversation as it grows, so re-read what you need again.\n"
        "The harness enforces your budget (wall time, steps, tokens, dollars) and shows what is left after "
        "each step. When it runs out the run stops and your workspace is scored as it is, so put a valid "
        "submission in place early, then improve it."
    )


def resumed_history(ctx: AgentContext) -> list[Message] | None:
    """A resumed run's conversation as the attempt before left it, told that it goes on (its
    tool calls that never ended answered as stopped); None on a first attempt."""
    if ctx.resumed is None or ctx.run_dir is None:
        return None
    history = conversation.load(ctx.run_dir)
    if not history:
        return None
    note = conversation.resumed_note(ctx.resumed.why, ctx.resumed.attempt) + "\n" + ctx.budget.note()
    last = history[-1]
    if last.role == "assistant":  # stopped while its tools ran: each call is answered, as the APIs require
        stopped = [
            ToolResult(c.id, "[stopped: the run was stopped before this call ended]", True) for c in last.tool_calls
        ]
        history.append(Message("user", note, tool_results=stopped))
    else:
        last.text = f"{last.text}\n{note}" if last.text else note
    return history


def message_chars(m: Message) -> int:
    return (
        len(m.text)
        + sum(len(r.content) for r in m.tool_results)
        + sum(len(json.dumps(c.arguments)) for c in m.tool_calls)
    )


def fit_context(history: list[Message], limit: int) -> int:
    """Elide the oldest tool outputs and long tool arguments until the conversation fits in
    `limit` characters. The instructions and the latest exchange are always kept whole.
    Returns how many items were elided (elided text stays elided, so the prefix is stable)."""
    total = sum(message_chars(m) for m in history)
    elided = 0
    for m in history[1:-2]:
        if total <= limit:
            break
        for r in m.tool_results:
            if len(r.content) > ELIDE_MIN_CHARS:
                note = f"[output elided to save context: {len(r.content)} characters]"
                total -= len(r.content) - len(note)
                r.content, elided = note, elided + 1
        for c in m.tool_calls:
            before = len(json.dumps(c.arguments))
            c.arguments = {
                k: f"[elided to save context: {len(v)} characters]"
                if isinstance(v, str) and len(v) > ELIDE_MIN_CHARS
                else v
                for k, v in c.arguments.items()
            }
            after = len(json.dumps(c.arguments))
            if after < before:
                total -= before - after
                elided += 1
    return elided


class LlmAgent(Agent):
    proxy_retries = 0  # the loop retries each call itself (its config's policy, each try an event)
    emits_tool_events = True  # it runs the tools: the harness need not read them from its calls

    def __init__(self, cfg: AgentConfig):
        """Check the options and read the key now: this runs before the MLflow run exists."""
        self.cfg = cfg
        self.options = parse_options(cfg)
        self._api_key = read_api_key(cfg, self.options)
        self.price = price_of(self.options)
        self.kept: Path | None = None  # where the conversation is kept, while the agent runs

    @classmethod
    def check_config(cls, cfg: AgentConfig) -> None:
        options = parse_options(cfg)
        read_api_key(cfg, options)
        price_of(options)

    def redact(self, text: str) -> str:
        """Never let the key reach the model, the trajectory or a trace, even if a command printed it."""
        return text.replace(self._api_key, "***") if self._api_key else text

    def warm_up(self) -> None:
        """Start importing the SDK (a second or more) on a thread while the run's sandbox starts,
        which mostly waits on another process; the agent's own import then finds it done."""

        def load() -> None:
            try:
                importlib.import_module(self.options.provider)
            except Exception:  # the agent's own import reports it
                pass

        threading.Thread(target=load, name=f"import {self.options.provider}", daemon=True).start()

    def model_upstreams(self) -> dict[str, Upstream]:
        """What the run's metering proxy serves this agent: its provider, with the real key, and
        its model alone, at its price."""
        o = self.options
        upstream = Upstream(upstream_url(o.provider, o.base_url), self._api_key or NO_KEY, models={o.model: self.price})
        return {o.provider: upstream}

    def make_provider(self, base_url: str, token: str, seed: int) -> Any:
        """The SDK client, talking to the run's proxy at BASE_URL; its errors name the upstream."""
        from mlrb.models import providers

        o, upstream = self.options, upstream_url(self.options.provider, self.options.base_url)
        if o.provider == "anthropic":
            return providers.AnthropicProvider(token, base_url, o.temperature, shown_as=upstream)
        return providers.OpenAIProvider(token, base_url, o.temperature, o.max_tokens_param, seed, shown_as=upstream)

    def run(self, ctx: AgentContext) -> AgentOutcome:
        o, sink = self.options, ctx.events
        if ctx.model is None:
            raise RuntimeError(
                "the LLM agent calls its model through the run's metering proxy, and the run started none"
            )
        provider = self.make_provider(ctx.model.base_url(o.provider), ctx.model.token, ctx.seed)
        env = ToolEnv(ctx.sandbox, ctx.budget.remaining_s, o.command_timeout_s, o.tool_output_chars)
        system = system_prompt(ctx)
        history = resumed_history(ctx) or [Message("user", ctx.instructions + "\n\n" + ctx.budget.note())]
        # the conversation, kept in the run folder (out of the agent's reach) after each reply and step
        self.kept = ctx.run_dir
        sink.emit(events.AgentStarted(o.provider, o.model, [t.name for t in TOOLS], system))
        while True:
            limit = ctx.budget.exhausted()
            if limit:
                return AgentOutcome(
                    Status.BUDGET_EXHAUSTED, limit, f"the {limit} budget ran out after {ctx.budget.steps} steps"
                )
            ctx.budget.record_step()
            step = ctx.budget.steps
            sink.emit(events.StepStarted(step, ctx.budget.note()))
            outcome = self.step(ctx, sink, provider, env, system, history, step)
            self.keep(history)
            sink.emit(events.StepEnded(step, dataclasses.asdict(outcome) if outcome else None))
            ctx.step_ended(step)
            if outcome is not None:
                return outcome

    def step(self, ctx, sink, provider, env, system, history, step) -> AgentOutcome | None:
        """One model call and the tool calls it asks for; an outcome when the run ends here."""
        elided = fit_context(history, self.options.context_chars)
        if elided:
            sink.emit(events.ContextElided(step, elided))
        max_tokens = self.max_tokens(ctx.budget)
        request = provider.request(self.options.model, system, history, TOOLS, max_tokens)
        reply = self.call_model(ctx, sink, provider, request, step)
        if isinstance(reply, AgentOutcome):
            return reply
        history.append(Message("assistant", reply.text, tool_calls=reply.tool_calls))
        self.keep(history)  # a kill while its tools run does not pay for this reply again

        results: list[ToolResult] = []
        summary: str | None = None
        for call in reply.tool_calls:
            output = self.use_tool(sink, env, call, step)
            results.append(ToolResult(call.id, output.text, output.is_error))
            if call.name == SUBMIT and not output.is_error:
                summary = str(call.arguments.get("summary") or "")
                break  # calls after the submission are not run: the run ends here
        if summary is not None:
            sink.emit(events.Submitted(step, summary))
            return AgentOutcome(Status.OK, None, summary or "the agent submitted")
        nudge = (
            "" if reply.tool_calls else "No tool was called. Go on with the tools, or call submit when you are done.\n"
        )
        history.append(Message("user", nudge + ctx.budget.note(), tool_results=results))
        return None

    def keep(self, history: list[Message]) -> None:
        if self.kept is not None:
            conversation.save(self.kept, history)

    def max_tokens(self, budget: Budget) -> int:
        """The per-call cap, never more than the output-token budget has left."""
        cap = self.options.max_tokens_per_call
        if budget.cfg.max_output_tokens is not None:
            cap = min(cap, budget.cfg.max_output_tokens - budget.output_tokens)
        return max(1, cap)

    def retry_policy(self) -> Backoff:
        o = self.options
        return Backoff(retries=o.max_retries, base_s=o.retry_base_delay_s, max_s=o.retry_max_delay_s)

    def is_retried(self, error: ApiError) -> bool:
        """An HTTP error whose status agent.options.retry_statuses names; a failure with no
        status (a lost connection, a timeout, a reply that is not the API's) if it is transient."""
        if error.status is None:
            return error.transient
        return any(status_matches(error.status, pattern) for pattern in self.options.retry_statuses)

    def call_model(self, ctx, sink, provider, request, step) -> Reply | AgentOutcome:
        """One model call, retried on the errors the config names, each try bounded by the
        remaining wall time and reported (each try; a retry and its pause; giving up)."""
        policy = self.retry_policy()

        def retried(error: BaseException) -> bool:
            return isinstance(error, ApiError) and self.is_retried(error) and not ctx.budget.exhausted()

        def pause_s(state: RetryState) -> float:
            """Exponential, or longer if the server asked for it; never past the maximum nor the wall time left."""
            retry_after = getattr(state.outcome.exception(), "retry_after_s", None) if state.outcome else None
            return min(policy.pause_s(state.attempt_number, retry_after or 0.0), ctx.budget.remaining_s())

        def note_retry(state: RetryState) -> None:
            error = state.outcome.exception() if state.outcome else None
            assert isinstance(error, ApiError)  # only these are retried
            message, delay = self.redact(str(error)), state.upcoming_sleep
            sink.emit(events.ApiRetry(step, state.attempt_number, error.status, message, delay))
            log.warning("step %d: %s; retrying in %.1f s", step, message, delay)

        attempt = 0
        try:
            for attempt_manager in policy.retrying(retried, pause_s, note_retry):
                with attempt_manager:
                    attempt = attempt_manager.retry_state.attempt_number
                    return self.try_call(ctx, provider, request, step, attempt)
        except NoTimeLeft:
            limit = ctx.budget.exhausted() or "wall_time"  # the wall time, or GPU-hours that reach theirs first
            return AgentOutcome(Status.BUDGET_EXHAUSTED, limit, "no time left for a model call")
        except ApiError as error:
            missing = metering.model_not_found(ctx.model)  # the provider has no such model: the config's fault
            if missing is not None:
                raise missing from None
            message = self.redact(str(error))
            limit = ctx.budget.exhausted()
            if limit:
                return AgentOutcome(
                    Status.BUDGET_EXHAUSTED, limit, f"the {limit} budget ran out during a model call: {message}"
                )
            sink.emit(events.ApiGaveUp(step, attempt, error.status, message))
            if self.is_retried(error):
                message += f" (gave up after {attempt} attempts)"
            return AgentOutcome(Status.AGENT_ERROR, None, message)
        raise AssertionError("tenacity's Retrying ended without a result or an error")  # unreachable: it re-raises

    def try_call(self, ctx, provider, request, step: int, attempt: int) -> Reply:
        """One try of a model call; raises ApiError when it fails. The proxy charges it to the
        budget and reports it (request, reply, usage, cost) as the run's events before the reply
        is whole, so they come before this step's tool calls."""
        timeout_s = min(self.options.request_timeout_s, ctx.budget.remaining_s())
        if timeout_s <= 0:
            raise NoTimeLeft()
        headers = {TIMEOUT_HEADER: f"{timeout_s:.3f}", ATTEMPT_HEADER: str(attempt)}
        reply = provider.call(request, timeout_s + PROXY_GRACE_S, headers)
        b = ctx.budget
        log.info(
            "step %d: %s (%d in / %d out tokens so far; $%.4f)",
            step,
            ", ".join(c.name for c in reply.tool_calls) or "no tool call",
            b.input_tokens,
            b.output_tokens,
            b.usd,
        )
        return reply

    def use_tool(self, sink: events.EventSink, env: ToolEnv, call: ToolCall, step: int) -> ToolOutput:
        sink.emit(events.ToolStarted(step, call.name, call.id, call.arguments))
        started = time.monotonic()
        if call.error:
            output = ToolOutput(f"error: {call.error}", is_error=True)
        else:
            output = run_tool(env, call.name, call.arguments)
        output.text = self.redact(output.text)
        duration_s = time.monotonic() - started
        sink.emit(
            events.ToolEnded(step, call.name, call.id, output.is_error, output.exit_code, duration_s, output.text)
        )
        return output
