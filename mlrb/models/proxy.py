"""The metering proxy: a run's one connection to the model APIs.

An agent talks to the proxy as it would to the provider, with the run's token as its API
key (worth nothing anywhere else):

    <proxy>/anthropic/v1/messages           the Anthropic Messages API
    <proxy>/openai/v1/chat/completions      OpenAI Chat Completions
    <proxy>/openai/v1/responses             OpenAI Responses

streaming or not. For each call the proxy

- checks the token (a wrong one: 401, in the provider's error shape);
- refuses a model the run may not call (the agent's config lists them) as the provider answers
  an unknown model: a 404, Anthropic's `not_found_error`, OpenAI's `model_not_found`;
- notes the upstream's own such answer for a model the config allows (`missing_model`): the
  config names a model the provider does not serve (a retired one, say), and the agent ends the
  run as a configuration error (mlrb/models/metering.py); later calls of that model get the same
  answer from the proxy, without going upstream;
- refuses the call once the run's budget is spent (`meter.spent()`), as the provider says
  an account is out of credit: Anthropic's 400 `invalid_request_error`, OpenAI's 429
  `insufficient_quota`; nothing goes upstream;
- holds what the call may cost from the budget while it is in flight (`meter.reserve()`: its
  request's tokens, the most it may write, priced at the tier it asks for), so calls made at once cannot spend the
  budget many times over: a call that the holds of the calls in flight leave no room for is
  answered 429, a rate limit the SDKs retry, until they end;
- sends it upstream with the real key, retrying connection failures, 408, 409, 429 and
  5xx on mlrb's one retry schedule (mlrb/core/retries.py; a `retry-after` header wins), as the
  SDKs do;
- passes the response back as it arrives: a stream is written to the agent chunk by chunk,
  never held back;
- reads the provider's own usage fields from the response (for a stream, from its events;
  an OpenAI chat stream is asked for its usage, `stream_options.include_usage`), each kind of
  token apart (input, cache reads, cache writes at each lifetime, output: mlrb/models/api_shapes.py),
  and charges them to the meter at the model's price for each (mlrb/models/prices.py), at the
  tier the provider says it served the call at (mlrb/models/request_rules.py's `billed_tier`),
  releasing the call's hold;
- charges every call the upstream served, whatever the agent does: an agent that hangs up
  early (once it has its answer's text, say) is sent nothing more, but its reply is still read
  to its end for its usage; a reply cut off before its usage is charged an estimate;
- at the run's end (`settle_open`), waits a while for the calls still in flight, each read from
  the upstream to its end whether or not the agent still listens, and charges any that has not
  ended by then what it holds, marked as an estimate: an agent that stops with a call open (it
  exits, its wall time runs out, a signal stops it) pays for the call all the same, and no call
  goes upstream after that;
- hands the whole call (request, response, usage, cost, timings) to `on_call` before the
  response's last bytes (a stream's closing event) go out: once an agent has its answer,
  the call is charged and recorded.
  A server that reports no usage (some local ones), or a reply cut off before it, is charged
  an estimate, about 4 characters a token, and the call says so (`estimated`).

An agent may send, with each call, how long it will wait (`x-mlrb-timeout-s`: the proxy then
gives up upstream first, answering 504, so the call is still recorded in its place) and which
try of its own this is (`x-mlrb-attempt`, for an agent that retries by itself and has the proxy
started with `max_retries=0`: the built-in loop). Neither header goes upstream.

The real keys stay in this process: they are never sent back, and the agent's headers that
carry a key are replaced, not forwarded.

It listens on loopback (`url`) and, with `unix_socket=True`, on a unix socket too
(`endpoint().socket`): a confined sandbox, which has no network, gets that socket mounted and
reaches the proxy through it (mlrb/sandbox/model_bridge.py).
"""

from __future__ import annotations

import dataclasses
import hmac
import http.client
import json
import logging
import math
import os
import shutil
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from mlrb.core import leftovers
from mlrb.core.budget import Spend
from mlrb.core.retries import Backoff
from mlrb.models.api_shapes import Usage, delta_tokens_of, reply_of, tier_of, usage_of
from mlrb.models.endpoint import ModelEndpoint
from mlrb.models.prices import CONFIG_RATES, Charge, Price, flat
from mlrb.models.request_rules import (
    NOT_FORWARDED_HEADERS,
    billed_tier,
    canonical_body,
    check_request,
    fees_of,
    parse_body,
    requested_tier,
    unpriced_tier,
)

log = logging.getLogger(__name__)

ROUTES = {  # the proxy's path -> (provider, the upstream's path under its base URL)
    "/anthropic/v1/messages": ("anthropic", "/v1/messages"),
    "/openai/v1/chat/completions": ("openai", "/chat/completions"),
    "/openai/v1/responses": ("openai", "/responses"),
}
# Request headers never forwarded: hop-by-hop ones, the ones the proxy sets, and every header
# that may carry the agent's key (it is the run's token, not a key upstream knows).
TIMEOUT_HEADER, ATTEMPT_HEADER = "x-mlrb-timeout-s", "x-mlrb-attempt"  # the harness's own: never forwarded
DROPPED_HEADERS = {
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "authorization",
    "x-api-key",
    "accept-encoding",
    TIMEOUT_HEADER,
    ATTEMPT_HEADER,
} | NOT_FORWARDED_HEADERS
CHARS_PER_TOKEN = 4  # the estimate for a server that reports no usage
OUTPUT_CAPS = ("max_tokens", "max_completion_tokens", "max_output_tokens")  # a request's cap on what the model writes
DEFAULT_OUTPUT_HOLD = 4096  # the output tokens held for a call that sets no cap
RESPONSE_DROPPED = {"content-length", "connection", "keep-alive", "transfer-encoding", "content-encoding"}
RETRIED_STATUSES = {408, 409, 429}  # and every 5xx
PROVIDERS = ("anthropic", "openai")
DEFAULT_BASE_URLS = {"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com/v1"}
BASE_URL_ENV = {"anthropic": "ANTHROPIC_BASE_URL", "openai": "OPENAI_BASE_URL"}


@dataclass(frozen=True)
class Upstream:
    """Where a provider's calls go, the real key they carry, and the models an agent may call."""

    base_url: str  # e.g. https://api.anthropic.com (Anthropic), https://api.openai.com/v1 (OpenAI)
    api_key: str
    price_input_per_mtok: float = 0.0  # USD per million tokens, for any model when `models` is None
    price_output_per_mtok: float = 0.0
    # The models an agent may call, each at its price; any other is refused. None: any model, at
    # the prices above (an agent's upstreams always list theirs: mlrb/agents/llm.py, command.py).
    models: Mapping[str, Price] | None = None

    def price_of(self, provider: str, model: str) -> Price | None:
        """MODEL's price, or None when it may not be called."""
        if self.models is None:
            return flat(provider, model, self.price_input_per_mtok, self.price_output_per_mtok, "the proxy's price")
        return self.models.get(model)


@dataclass(frozen=True)
class MissingModel:
    """A model the upstream said it does not have, when the run's config allows it."""

    provider: str
    model: str
    base_url: str  # the upstream that said so
    message: str  # its own words, e.g. "model: claude-3-5-sonnet-20240620"
    answer: dict[str, Any] = field(default_factory=dict)  # its whole answer (a 404), given to later calls


def model_not_found(provider: str, status: int, body: Any) -> str | None:
    """The upstream's message when its answer says it has no such model (Anthropic: 404
    `not_found_error` "model: NAME"; OpenAI: 404 with the code `model_not_found`), else None."""
    error = body.get("error") if status == 404 and isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    message = str(error.get("message") or "")
    if provider == "anthropic":
        found = error.get("type") == "not_found_error" and message.startswith("model:")
    else:
        found = error.get("code") == "model_not_found"
    return message if found else None


def upstream_url(provider: str, configured: str | None) -> str:
    """Where PROVIDER's calls go: the configured base URL, else the SDK's own variable
    ($ANTHROPIC_BASE_URL, $OPENAI_BASE_URL), else the provider's API."""
    return configured or os.environ.get(BASE_URL_ENV[provider]) or DEFAULT_BASE_URLS[provider]


@dataclass
class Call:
    """One call as the proxy saw it."""

    provider: str
    endpoint: str  # the proxy's path
    model: str
    stream: bool
    status: int  # the status the agent got
    usage: Usage = field(default_factory=Usage)  # what it is charged for: the upstream's usage, or an estimate
    charge: Charge = field(default_factory=Charge)  # what that costs, by what it paid for
    usd: float = 0.0  # the charge's whole
    latency_s: float = 0.0  # from the request to the response's last byte
    first_byte_s: float | None = None  # to the response's first byte (the stream's start)
    attempts: int = 0  # upstream tries (0: refused by the proxy)
    refused: str | None = None  # why the proxy answered itself (bad token, budget spent)
    estimated: bool = False  # the server reported no usage (or the reply broke off): the tokens are an estimate
    price: Price | None = None  # the model's price (None: refused before it was known)
    tier: dict[str, str] = field(default_factory=dict)  # the tier billed, as the price's context ({}: standard)
    timeout_s: float | None = None  # how long the agent said it would wait (x-mlrb-timeout-s)
    agent_attempt: int | None = None  # the agent's own try (x-mlrb-attempt)
    started_ns: int = 0  # wall time the request arrived (time.time_ns())
    request: dict[str, Any] = field(default_factory=dict)
    response: Any = None  # the JSON body, or a stream's events as a list
    # Still open when the run ended and gave up waiting for it (`settle_open`): charged what it held.
    open_at_end: bool = False

    @property
    def input_tokens(self) -> int:
        return self.usage.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.usage.output_tokens


class Meter(Protocol):
    """What the proxy asks before each call and charges after it: the run's budget (mlrb/core/budget.py)."""

    def spent(self) -> str | None:
        """The first limit a call may not go past, or None while there is budget left."""
        ...

    def reserve(self, hold: Spend) -> str | None:
        """Hold what a call may cost while it is in flight: None once held, else the first limit
        that what is spent and held already reaches."""
        ...

    def settle(self, hold: Spend, used: Spend) -> None:
        """Release a call's hold and charge what it used."""
        ...


class InFlight:
    """A call admitted by the meter and not yet settled: what it holds, and whether it has been
    charged and reported. The call's own thread settles it; at the run's end `settle_open` may
    settle it first (charging its hold), and then the thread's own settling does nothing."""

    def __init__(self, call: Call, meter: Meter, hold: Spend):
        self.call, self.meter, self.hold = call, meter, hold
        self.settled = False
        self.reported = False


def error_body(provider: str, status: int, kind: str, message: str, code: str | None = None) -> dict[str, Any]:
    """An error as the provider writes one, so the agent's SDK raises its own error type."""
    if provider == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def refusal(provider: str, reason: str) -> tuple[int, dict[str, Any]]:
    """The answer to a call made after the budget is spent: the provider's "out of credit"."""
    message = f"mlrb: the run's budget is spent ({reason}); no more model calls are allowed"
    if provider == "anthropic":
        return 400, error_body(provider, 400, "invalid_request_error", message)
    return 429, error_body(provider, 429, "insufficient_quota", message, code="insufficient_quota")


def not_allowed(provider: str, model: str, allowed: list[str]) -> tuple[int, dict[str, Any]]:
    """The answer to a call naming a model the run may not call: the provider's unknown model."""
    note = f"(mlrb: this run may call {', '.join(allowed) or 'no model'} here)"
    if provider == "anthropic":
        return 404, error_body(provider, 404, "not_found_error", f"model: {model} {note}")
    message = f"The model `{model}` does not exist or you do not have access to it. {note}"
    return 404, error_body(provider, 404, "invalid_request_error", message, code="model_not_found")


def held_back(provider: str, limit: str) -> tuple[int, dict[str, Any]]:
    """The answer to a call that the budget held by the calls in flight leaves no room for: a rate
    limit, which the SDKs retry (the calls' ends may leave room)."""
    message = f"mlrb: the calls in flight hold the rest of the run's budget ({limit}); try again when they have ended"
    if provider == "anthropic":
        return 429, error_body(provider, 429, "rate_limit_error", message)
    return 429, error_body(provider, 429, "requests", message, code="rate_limit_exceeded")


def hold_for(price: Price, request: dict[str, Any], body: bytes, tier: Mapping[str, str] | None = None) -> Spend:
    """What a call may cost, held from the budget while it is in flight: its request's tokens
    (about 4 characters a token) and the most it may write (its own cap, else a default), at TIER's
    rates (the tier it asked for, where that costs more than the standard one)."""
    caps = [v for v in (request.get(k) for k in OUTPUT_CAPS) if isinstance(v, int) and not isinstance(v, bool)]
    output_tokens = max(caps) if caps and max(caps) > 0 else DEFAULT_OUTPUT_HOLD
    input_tokens = len(body) // CHARS_PER_TOKEN
    return Spend(input_tokens, output_tokens, price.usd(input_tokens, output_tokens, tier))


def spend_of(usage: Usage, usd: float, fee_usd: float = 0.0) -> Spend:
    """What a call that used USAGE, priced USD (FEE_USD of it beside its tokens), spent of the budget."""
    return Spend(
        usage.input_tokens,
        usage.output_tokens,
        usd,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
        usage.web_searches,
        fee_usd,
    )


# The events after which an SDK may hand the agent its answer without reading on.
CLOSING_EVENTS = {"message_stop", "error", "response.completed", "response.failed", "response.incomplete"}


class StreamUsage:
    """Reads a server-sent event stream as it passes and keeps its usage and events."""

    def __init__(self) -> None:
        self.pending = b""
        self.events: list[Any] = []
        self.usage: Usage | None = None  # the stream's usage so far (None: it carried none)
        self.final = False  # whether it carried its final usage (not only message_start's)
        self.ended = False  # whether the stream's closing event has passed

    def feed(self, chunk: bytes) -> None:
        self.pending += chunk
        while b"\n\n" in self.pending:
            raw, self.pending = self.pending.split(b"\n\n", 1)
            self.event(raw)

    def event(self, raw: bytes) -> None:
        data = b"\n".join(line[5:].lstrip() for line in raw.splitlines() if line.startswith(b"data:"))
        if data == b"[DONE]":  # Chat Completions: the OpenAI SDK stops reading here
            self.ended = True
            return
        if not data:
            return
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):  # an event nested past the parser's depth is no event either
            return
        self.events.append(event)
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind in CLOSING_EVENTS:
            self.ended = True
        if kind == "message_start":  # Anthropic: the input, and the output so far
            self.take(usage_of(event.get("message")), final=False)
        elif kind == "message_delta":  # Anthropic: its running totals, near the end (the input when it grew)
            self.take(delta_tokens_of(event.get("usage"), self.usage))
        elif kind in ("response.completed", "response.incomplete", "response.failed"):  # Responses: its usage in it
            self.take(usage_of(event.get("response")))
        elif isinstance(event.get("usage"), dict):  # Chat Completions: the last chunk
            self.take(usage_of(event))

    def take(self, usage: Usage | None, final: bool = True) -> None:
        if usage is not None:
            self.usage = usage
            self.final = final


def unpriced_fee(provider: str, request: dict[str, Any], price: Price) -> str | None:
    """Why a call that offers a tool the provider bills beside tokens is refused: the model's price has
    no rate for it (the table's, or the config's), so the call cannot be charged what it costs."""
    for kind, rate in fees_of(provider, request).items():
        if not price.has_rate(rate):
            key = next(k for k, v in CONFIG_RATES.items() if v == rate)
            return (
                f"mlrb proxy: the tool {kind!r} is billed beside the call's tokens, and the run has no price "
                f"for it with model {price.model!r} (set price_{key} in the agent's options)"
            )
    return None


def positive(value: str | None) -> float | None:
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return number if math.isfinite(number) and number > 0 else None


def whole(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def estimated_usage(call: Call) -> tuple[int, int]:
    """Tokens of a call whose server reported none: about 4 characters a token, of the request
    and of what the model wrote (its text and its tool calls' arguments)."""
    text, tool_calls, _ = reply_of(call.response, call.stream)
    written = text + json.dumps([t.get("arguments") for t in tool_calls])
    return len(json.dumps(call.request)) // CHARS_PER_TOKEN, len(written) // CHARS_PER_TOKEN


def charged_usage(call: Call, status: int, reported: Usage | None, final: bool) -> Usage:
    """The usage a call is charged: the upstream's final usage; for a reply served without it
    (cut off, or a server that reports none) an estimate, no less than what it did report (its
    cached tokens kept), and the call says so. An error the upstream answered costs what it
    reports, else nothing."""
    if status != 200:
        return reported or Usage()
    if reported is not None and final:
        return reported
    call.estimated = True
    estimate = Usage(*estimated_usage(call))
    return reported.at_least(estimate) if reported is not None else estimate


class UpstreamConnections:
    """Kept-alive connections to the upstreams, one per thread and host."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.local = threading.local()

    def get(self, base_url: str) -> http.client.HTTPConnection:
        pool = self.local.__dict__.setdefault("pool", {})
        if base_url not in pool:
            parts = urlsplit(base_url)
            kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
            pool[base_url] = kind(parts.netloc, timeout=self.timeout_s)
        return pool[base_url]

    def drop(self, base_url: str) -> None:
        connection = self.local.__dict__.get("pool", {}).pop(base_url, None)
        if connection is not None:
            connection.close()


class QuietWhenClientsHangUp:
    """A server mixin: a client that hangs up (an SDK's timeout, or an agent resetting its connections
    on purpose) ends its own connection and nothing more. socketserver would print each one's
    traceback to standard error, which a run sends to its log file: as many as the agent likes."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # reset, broken pipe, aborted
            return
        super().handle_error(request, client_address)  # type: ignore[misc]


class ProxyServer(QuietWhenClientsHangUp, ThreadingHTTPServer):
    pass


class ProxyUnixServer(QuietWhenClientsHangUp, socketserver.ThreadingUnixStreamServer):
    pass


class MeteringProxy:
    """The proxy, serving on 127.0.0.1 (a free port unless given) in threads of this process."""

    def __init__(
        self,
        upstreams: dict[str, Upstream],
        token: str,
        meter: Meter | None,
        on_call: Callable[[Call], None] | None = None,
        port: int = 0,
        max_retries: int = 6,
        retry_base_delay_s: float = 1.0,
        retry_max_delay_s: float = 60.0,
        request_timeout_s: float = 600.0,
        unix_socket: bool = False,
        network_allowed: bool = False,
    ):
        # The meter may be set later (the run's budget starts when its agent does); until
        # then every call is refused.
        self.upstreams, self.token, self.meter = upstreams, token, meter
        # Whether the run's task lets the agent reach the network: without it, neither may its calls (request_rules).
        self.network_allowed = network_allowed
        self.on_call = on_call or (lambda call: None)
        # Upstream tries after the first, and the pauses between them (a Retry-After aside: `pause_s`).
        self.retries = Backoff(retries=max_retries, base_s=retry_base_delay_s, max_s=retry_max_delay_s)
        self.connections = UpstreamConnections(request_timeout_s)
        self.refused: str | None = None  # the first budget limit a refused call named
        self.missing_model: MissingModel | None = None  # the first allowed model the upstream said it lacks
        self.in_flight: set[InFlight] = set()  # calls admitted and not yet settled
        self.flights = threading.Condition()  # guards `in_flight` and each one's flags; notified as one settles
        self.ended = False  # the run has ended (`settle_open`): no call goes upstream any more
        handler = self.handler_class()
        self.server = ProxyServer(("127.0.0.1", port), handler)
        self.servers: list[socketserver.BaseServer] = [self.server]
        self.socket_dir: Path | None = None
        if unix_socket:  # in a folder only this user can list; the socket itself any sandbox user may use
            self.socket_dir = leftovers.new_temp_folder("mlrb-proxy")
            self.servers.append(ProxyUnixServer(str(self.socket_dir / "model.sock"), handler))
            os.chmod(self.socket_dir / "model.sock", 0o666)
        for server in self.servers:
            server.daemon_threads = True  # type: ignore[attr-defined]
            threading.Thread(target=server.serve_forever, name="metering-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def endpoint(self) -> ModelEndpoint:
        """Where a sandbox reaches the proxy (the unix socket: `unix_socket=True`)."""
        if self.socket_dir is None:
            raise ValueError("the proxy was started without a unix socket (unix_socket=True)")
        return ModelEndpoint(socket=self.socket_dir / "model.sock", url=self.url)

    def base_url(self, provider: str) -> str:
        """What an agent's SDK takes as its base URL for PROVIDER."""
        return f"{self.url}/anthropic" if provider == "anthropic" else f"{self.url}/openai/v1"

    def admit(self, call: Call, meter: Meter, hold: Spend) -> InFlight | None:
        """Note a call the meter has admitted, holding HOLD, as in flight until it settles; None
        once the run has ended."""
        flight = InFlight(call, meter, hold)
        with self.flights:
            if self.ended:
                return None
            self.in_flight.add(flight)
        return flight

    def settle(self, flight: InFlight, used: Spend) -> bool:
        """Charge a call in flight what it USED and release its hold, unless the run's end has
        charged it already (`settle_open`); whether this charged it."""
        with self.flights:
            if flight.settled:
                return False
            flight.settled = True
        flight.meter.settle(flight.hold, used)
        return True

    def mark_reported(self, flight: InFlight | None) -> bool:
        """Whether the caller is the one to report FLIGHT's call (once: its thread, or the run's end).
        A call is in flight until it is reported: charged and not yet recorded, the run's end waits
        for its record too."""
        if flight is None:
            return True
        with self.flights:
            first, flight.reported = not flight.reported, True
            self.in_flight.discard(flight)
            self.flights.notify_all()
            return first

    def settle_open(self, wait_s: float) -> list[Call]:
        """At the run's end: wait up to WAIT_S for the calls in flight to end (each is read from
        the upstream to its end for its usage, whether or not the agent still listens), then charge
        each call still open what it holds, as an estimate, and report it. Returns those calls.
        Whatever stopped the agent, every call the upstream was sent is charged and recorded."""
        deadline = time.monotonic() + max(0.0, wait_s)
        with self.flights:
            self.ended = True
            while self.in_flight and (left := deadline - time.monotonic()) > 0:
                self.flights.wait(left)
            cut = [flight for flight in self.in_flight if not flight.settled]
            for flight in cut:
                flight.settled = True
            # charged by their own threads, and not yet recorded by them: recorded here, as charged
            unreported = [flight for flight in self.in_flight if flight not in cut and not flight.reported]
            for flight in unreported:
                flight.reported = True
            self.in_flight.clear()
        for call in (flight.call for flight in unreported):
            call.latency_s = call.latency_s or (time.time_ns() - call.started_ns) / 1e9
            try:
                self.on_call(call)
            except Exception:  # recording a call must not stop the others'
                log.exception("recording a model call failed")
        charged = []
        for flight in cut:
            hold = flight.hold
            flight.meter.settle(hold, hold)
            # A copy: the call's own thread may still be writing the original.
            held = Usage(hold.input_tokens, hold.output_tokens)
            price = flight.call.price
            charge = price.charge(held, flight.call.tier) if price is not None else Charge(hold.usd)
            call = dataclasses.replace(
                flight.call,
                usage=held,
                charge=charge,
                usd=hold.usd,
                estimated=True,
                open_at_end=True,
                latency_s=(time.time_ns() - flight.call.started_ns) / 1e9,
            )
            charged.append(call)
            if self.mark_reported(flight):
                try:
                    self.on_call(call)
                except Exception:  # recording a call must not stop the others'
                    log.exception("recording a model call failed")
        return charged

    def close(self) -> None:
        self.on_call = lambda call: None  # a call still being answered is not the run's any more
        for server in self.servers:
            server.shutdown()
            server.server_close()
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    def __enter__(self) -> MeteringProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- one call -------------------------------------------------------------------
    def authorised(self, provider: str, headers: Any) -> bool:
        given = headers.get("x-api-key") or ""
        bearer = headers.get("authorization") or ""
        if bearer.lower().startswith("bearer "):
            given = given or bearer[7:].strip()
        return bool(given) and hmac.compare_digest(given.encode(), self.token.encode())

    def forward(
        self, provider: str, path: str, headers: dict[str, str], body: bytes, timeout_s: float | None = None
    ) -> Iterator[tuple[http.client.HTTPResponse, int]]:
        """Send the call upstream, retrying what is transient; yields the response to pass on
        (with its attempt number) once, then closes it. Raises OSError when every try failed,
        TimeoutError once `timeout_s` (the agent's wait) is spent."""
        upstream = self.upstreams[provider]
        headers = {
            **headers,
            **(
                {"x-api-key": upstream.api_key}
                if provider == "anthropic"
                else {"authorization": f"Bearer {upstream.api_key}"}
            ),
        }
        target = urlsplit(upstream.base_url).path.rstrip("/") + path
        deadline = time.monotonic() + timeout_s if timeout_s is not None else math.inf
        for attempt in range(1, self.retries.retries + 2):
            connection = self.connections.get(upstream.base_url)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no time left of the agent's wait")
            connection.timeout = min(left, self.connections.timeout_s)  # for a new socket; a kept one is set here
            if connection.sock is not None:
                connection.sock.settimeout(connection.timeout)
            try:
                connection.request("POST", target, body=body, headers=headers)
                response = connection.getresponse()
            except (OSError, http.client.HTTPException) as e:
                self.connections.drop(upstream.base_url)
                if attempt > self.retries.retries or isinstance(e, TimeoutError) and time.monotonic() >= deadline:
                    raise
                time.sleep(min(self.pause_s(attempt, None), max(0.0, deadline - time.monotonic())))
                continue
            transient = response.status in RETRIED_STATUSES or response.status >= 500
            if transient and attempt <= self.retries.retries:
                response.read()
                time.sleep(
                    min(self.pause_s(attempt, response.getheader("retry-after")), max(0.0, deadline - time.monotonic()))
                )
                continue
            try:
                yield response, attempt
            finally:
                if not response.isclosed():
                    self.connections.drop(upstream.base_url)  # not read to its end: the connection is spent
            return

    def pause_s(self, attempt: int, retry_after: str | None) -> float:
        """The pause before retry ATTEMPT: the upstream's Retry-After where it sent one (the SDKs take it
        so too), else mlrb's one retry schedule (mlrb/core/retries.py); never past its longest pause."""
        try:
            stated = float(retry_after) if retry_after is not None else math.nan
        except ValueError:
            stated = math.nan
        if math.isfinite(stated) and stated >= 0:
            return min(stated, self.retries.max_s)
        return self.retries.pause_s(attempt)

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        """The request handler's class, bound to this proxy."""
        return type("Handler", (CallHandler,), {"proxy": self})


class CallHandler(BaseHTTPRequestHandler):
    """The proxy's side of a connection: each request is one model call, taken through its steps. It
    is read (`read_call`); answered by the proxy itself when the run does not allow it (`refusal_of`);
    held from the budget while in flight (`admit`); sent upstream (`go_upstream`); its reply passed on
    as it arrives (`pass_on`: `send_head`, `relay`) and charged what it used (`charge`, `settle`); and
    reported once (`report`)."""

    protocol_version = "HTTP/1.1"
    proxy: MeteringProxy  # set by MeteringProxy.handler_class
    # Of the request being answered: when it arrived, whether its call was reported, whether the agent
    # has hung up, and the call in flight once the meter has admitted it (until settled).
    started = 0.0
    reported = False
    agent_gone = False
    flight: InFlight | None = None

    def setup(self) -> None:
        super().setup()
        # Each response goes out in a few writes (headers, chunks): without this, Nagle's
        # algorithm holds the next one back until the agent acknowledges (about 40 ms).
        if self.connection.family == socket.AF_INET:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args: Any) -> None:  # the run's events say what was called
        pass

    def do_POST(self) -> None:
        self.reported, self.agent_gone, self.flight = False, False, None
        self.started = time.monotonic()
        read = self.read_call(time.time_ns())
        if read is None:
            return
        call, upstream_path, body = read
        try:
            self.handle_call(call, upstream_path, call.request, body)
        finally:
            self.report(call)  # a call cut short (the agent went away) is recorded too

    def read_call(self, started_ns: int) -> tuple[Call, str, bytes] | None:
        """The call this request makes, the upstream's path for it and the body to send there; None once
        answered (a path the proxy does not serve, a body it does not read as JSON)."""
        proxy = self.proxy
        route = ROUTES.get(self.path.split("?", 1)[0])
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if route is None or route[0] not in proxy.upstreams:
            known = ", ".join(p for p, (provider, _) in ROUTES.items() if provider in proxy.upstreams)
            self.reply(
                404, error_body("openai", 404, "not_found", f"{self.path}: not served here; the proxy serves {known}")
            )
            return None
        provider, upstream_path = route
        request, why = parse_body(body)
        if request is None:
            self.reply(400, error_body(provider, 400, "invalid_request_error", why or "the body is not JSON"))
            return None
        body = canonical_body(request)  # what goes upstream is what was checked, not the agent's bytes
        call = Call(
            provider,
            self.path,
            str(request.get("model", "")),
            bool(request.get("stream")),
            0,
            request=request,
            timeout_s=positive(self.headers.get(TIMEOUT_HEADER)),
            agent_attempt=whole(self.headers.get(ATTEMPT_HEADER)),
            started_ns=started_ns,
        )
        return call, upstream_path, body

    def report(self, call: Call) -> None:
        """Hand the call to `on_call`, once."""
        if self.reported or not self.proxy.mark_reported(self.flight):  # the run's end may have reported it
            return
        self.reported = True
        call.latency_s = time.monotonic() - self.started
        try:
            self.proxy.on_call(call)
        except Exception:  # recording a call must not fail the agent's call
            log.exception("recording a model call failed")

    def handle_call(self, call: Call, upstream_path: str, request: dict, body: bytes) -> None:
        refused = self.refusal_of(call, request)
        if refused is not None:
            call.status, answer, call.refused = refused
            return self.reply(call.status, answer, call)
        hold = self.admit(call, request, body)
        if hold is None:
            return
        try:
            self.go_upstream(call, upstream_path, request, body)
        finally:
            if self.flight is not None and not self.flight.settled:  # it failed before its usage was read
                if call.attempts and call.status == 200:  # yet the upstream served it: charged what it held
                    call.usage = Usage(hold.input_tokens, hold.output_tokens)
                    call.estimated = True
                self.settle(call)

    def refusal_of(self, call: Call, request: dict) -> tuple[int, dict[str, Any], str] | None:
        """The proxy's own answer to a call the run does not allow, before anything goes upstream: its
        status, the provider's error body and the reason recorded. The token is not the run's, the run
        may not call the model, the request rules refuse it, or the upstream said it has no such model.
        None: the call may go on, and its price is set."""
        proxy, provider = self.proxy, call.provider
        if not proxy.authorised(provider, self.headers):
            message = "invalid x-api-key" if provider == "anthropic" else "Incorrect API key provided"
            answer = error_body(provider, 401, "authentication_error", message, code="invalid_api_key")
            return 401, answer, "the API key is not this run's token"
        upstream = proxy.upstreams[provider]
        call.price = upstream.price_of(provider, call.model)
        if call.price is None:
            status, answer = not_allowed(provider, call.model, sorted(upstream.models or ()))
            return status, answer, f"model not allowed: {call.model!r}"
        why = (
            check_request(provider, request, proxy.network_allowed)
            or unpriced_fee(provider, request, call.price)
            or unpriced_tier(provider, request, call.model, call.price.prices_tier)
        )
        if why is not None:
            return 400, error_body(provider, 400, "invalid_request_error", why), why
        missing = proxy.missing_model
        if missing is not None and (missing.provider, missing.model) == (provider, call.model):
            return 404, missing.answer, f"model not found upstream: {call.model!r}"
        return None

    def admit(self, call: Call, request: dict, body: bytes) -> Spend | None:
        """Hold what the call may cost from the run's budget, at the tier it asks for, and note it in
        flight: the hold; None once answered (the budget is spent, or held by the calls in flight; the
        run has ended)."""
        proxy, price = self.proxy, call.price
        assert price is not None  # refusal_of refuses a call whose model has no price
        meter = proxy.meter
        spent = meter.spent() if meter is not None else "not started"
        if meter is None or spent:
            self.refuse_spent(call, spent or "not started")
            return None
        call.tier = billed_tier(call.provider, requested_tier(call.provider, request), {})  # until the reply says
        hold = hold_for(price, request, body, call.tier)
        held = meter.reserve(hold)
        if held:
            spent = meter.spent()  # a call that ended meanwhile may have spent it
            if spent:
                self.refuse_spent(call, spent)
                return None
            call.refused = f"budget held by the calls in flight: {held}"
            call.status, answer = held_back(call.provider, held)
            self.reply(call.status, answer, call, {"retry-after": "1"})
            return None
        self.flight = proxy.admit(call, meter, hold)
        if self.flight is None:
            meter.settle(hold, Spend())
            self.refuse_spent(call, "the run has ended")
            return None
        return hold

    def refuse_spent(self, call: Call, spent: str) -> None:
        call.refused = f"budget spent: {spent}"
        self.proxy.refused = self.proxy.refused or spent
        call.status, answer = refusal(call.provider, spent)
        self.reply(call.status, answer, call)

    def settle(self, call: Call) -> None:
        """Price the call's usage, charge it, and release its hold."""
        call.charge = call.price.charge(call.usage, call.tier) if call.price is not None else Charge()
        call.usd = call.charge.usd
        if self.flight is not None:
            self.proxy.settle(self.flight, spend_of(call.usage, call.usd, call.charge.fee_usd))

    def go_upstream(self, call: Call, upstream_path: str, request: dict, body: bytes) -> None:
        proxy, provider = self.proxy, call.provider
        if call.stream and provider == "openai" and upstream_path == "/chat/completions":
            options = request.get("stream_options") or {}
            if not options.get("include_usage"):  # the usage comes in the stream's last chunk
                request["stream_options"] = {**options, "include_usage": True}
                body = canonical_body(request)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in DROPPED_HEADERS}
        headers["content-type"] = "application/json"  # the body the proxy wrote
        headers["content-length"] = str(len(body))
        where = proxy.upstreams[provider].base_url
        try:
            query = self.path.partition("?")[2]  # say Claude Code's ?beta=true: passed on as it came
            target = f"{upstream_path}?{query}" if query else upstream_path
            for response, attempt in proxy.forward(provider, target, headers, body, call.timeout_s):
                call.attempts, call.status = attempt, response.status
                self.pass_on(call, response)
        except (OSError, http.client.HTTPException) as e:
            if call.status:  # the answer had begun: it stands
                return
            if isinstance(e, TimeoutError):
                wait = call.timeout_s or proxy.connections.timeout_s
                call.status = 504
                message = f"mlrb proxy: {where} did not answer within {wait:.0f} s"
                return self.reply(504, error_body(provider, 504, "timeout_error", message), call)
            call.status = 502
            message = f"mlrb proxy: the upstream {where} is unreachable ({type(e).__name__}: {e})"
            self.reply(502, error_body(provider, 502, "api_error", message), call)

    def pass_on(self, call: Call, response: http.client.HTTPResponse) -> None:
        """Pass the upstream's reply on as it arrives, and charge the call. An agent that hangs
        up is sent nothing more, but the reply is still read to its end for its usage."""
        self.send_head(response)
        streamed = "text/event-stream" in (response.getheader("content-type") or "")
        reader = StreamUsage() if streamed else None
        body, held, cut = self.relay(call, response, reader)
        self.charge(call, response.status, reader, body, cut)
        self.report(call)  # before the last bytes: an agent that has its answer finds it charged
        if cut:  # the agent's reply ends cut off too, not closed as if whole
            self.close_connection = True
            return
        if held:
            self.to_agent(b"%x\r\n%s\r\n" % (len(held), held))
        self.to_agent(b"0\r\n\r\n")

    def send_head(self, response: http.client.HTTPResponse) -> None:
        """The upstream's status and headers, as the agent gets them: the body follows in chunks."""
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in RESPONSE_DROPPED:
                self.send_header(key, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.to_agent(None)

    def relay(
        self, call: Call, response: http.client.HTTPResponse, reader: StreamUsage | None
    ) -> tuple[bytes, bytes, bool]:
        """Send the reply's bytes on to the agent as they arrive, a stream's fed to READER as they pass:
        (a whole reply's bytes, a stream's bytes from its closing event on, held back to be sent once the
        call is reported, and whether the upstream's reply broke off or stalled past the timeout)."""
        body = bytearray()
        held = bytearray()
        try:
            while chunk := response.read1(65536):
                if call.first_byte_s is None:
                    call.first_byte_s = time.monotonic() - self.started
                if reader is None:
                    body += chunk
                else:
                    reader.feed(chunk)
                    if reader.ended:
                        held += chunk
                        continue
                self.to_agent(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except (OSError, http.client.HTTPException):
            return bytes(body), bytes(held), True
        return bytes(body), bytes(held), False

    def charge(self, call: Call, status: int, reader: StreamUsage | None, body: bytes, cut: bool) -> None:
        """Read the call's reply and usage (a stream's from READER, a whole reply's from BODY), note an
        upstream that says it has no such model, and charge the call at the tier it was billed at."""
        proxy = self.proxy
        if reader is not None:
            call.response = reader.events
            reported, final = reader.usage, reader.final
        else:
            try:
                call.response = json.loads(body or b"null")
            except ValueError:
                call.response = body.decode("utf-8", "replace")
            reported, final = usage_of(call.response), not cut
            said = model_not_found(call.provider, status, call.response)
            if said is not None and proxy.missing_model is None:  # noted before the agent has the answer
                proxy.missing_model = MissingModel(
                    call.provider, call.model, proxy.upstreams[call.provider].base_url, said, call.response
                )
        call.usage = charged_usage(call, status, reported, final)
        call.tier = billed_tier(call.provider, requested_tier(call.provider, call.request), tier_of(call.response))
        self.settle(call)

    def to_agent(self, data: bytes | None) -> None:
        """Send DATA (None: the headers) to the agent, unless it has hung up: then nothing more
        is sent, and its connection is closed once its call has been read and charged."""
        if self.agent_gone:
            return
        try:
            if data is None:
                self.end_headers()
            else:
                self.wfile.write(data)
                self.wfile.flush()
        except OSError:
            self.agent_gone = self.close_connection = True

    def reply(
        self, status: int, payload: dict[str, Any], call: Call | None = None, headers: dict[str, str] | None = None
    ) -> None:
        if call is not None:
            self.report(call)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.to_agent(None)
        self.to_agent(data)
