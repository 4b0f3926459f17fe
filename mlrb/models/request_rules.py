"""What an agent's model call may ask, checked by the metering proxy (mlrb/models/proxy.py) before
anything goes upstream: pure functions of the call's body.

The proxy is the run's one way to the providers, and the agent holds its token. It checks a call
(the model, the budget) and sends it upstream with the real key, so whatever it forwards unchecked
is the agent's to use against the run's rules:

- `parse_body`, `canonical_body`: the body is read strictly (UTF-8 JSON, each key once, no NaN),
  and what goes upstream is the object the proxy read, written out again, never the agent's bytes:
  a body that two JSON parsers read differently (a key given twice: Python keeps the last, others
  the first) would have the upstream serve a model, or a tool, the proxy never saw;
- `check_request`: the fields that make the provider do what the proxy can neither price nor
  reconcile with the run's rules: run another model than the one checked (fallbacks, a tool that
  names a model), bill at a rate no price has (OpenAI's scale tier, regional inference), bill beside
  tokens at a rate the run cannot price (code containers, stored files), generate out of sight
  (OpenAI's background responses, read later by another call), or hold one answer's worth of the
  budget for several (`n`); and, when the task allows no network, reach past the sandbox through
  the provider: the tools the provider runs itself (web search and fetch, code execution, MCP
  servers, file search), and content it fetches from a URL;
- `fees_of`: the tools a call offers that the provider bills beside tokens at a rate the run
  prices (a web search): the proxy lets them go upstream only at a price that has that rate;
- `unpriced_tier`, `requested_tier`, `billed_tier`: the service tiers a call may ask for (`TIERS`:
  OpenAI's priority and flex tiers, Anthropic's fast mode), and the tier it is billed at. A tier
  dearer than the standard one goes upstream only at a price that has its rates (the table's
  variant for the model, never a config's rates). The call is billed at the tier the provider says
  it served (mlrb/models/api_shapes.py's `tier_of`); where it says none, or one the run does not know,
  at the tier asked for when that costs more than the standard one, else at the standard one.

A refusal is a sentence for the agent: the proxy answers it as the provider answers a bad
request (400 `invalid_request_error`), so the agent's SDK raises its own error and the agent can
change its call.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# Request headers the proxy sends upstream none of (beside its own list): the body's type and
# encoding are the proxy's (it sends the body it wrote, as JSON), and the key the harness holds
# decides which organization, project or workspace a call is billed to, not the agent.
NOT_FORWARDED_HEADERS = {
    "content-type",
    "content-encoding",
    "expect",
    "openai-organization",
    "openai-project",
    "anthropic-workspace-id",
    "anthropic-user-profile-id",
}
# The keys the rules read: two keys that differ only in case, one of them among these, are refused
# (a parser that matches keys regardless of case, as Go's does, would read the other one).
RULE_KEYS = {
    "model",
    "stream",
    "stream_options",
    "tools",
    "type",
    "tool",
    "url",
    "image_url",
    "file_url",
    "source",
    "background",
    "n",
    "service_tier",
    "speed",
    "inference_geo",
    "fallbacks",
    "prompt",
    "mcp_servers",
    "container",
    "web_search_options",
    "environment",
    "execution",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "messages",
    "input",
    "system",
}
MAX_DEPTH = 256  # a request's nesting (a conversation's blocks, a tool's schema) is far less
OUTPUT_CAPS = ("max_tokens", "max_completion_tokens", "max_output_tokens")  # what the proxy's hold reads

# Tool types the agent's own program runs (in its sandbox): the provider only asks for them.
CLIENT_TOOL_PREFIXES = {"anthropic": ("bash_", "text_editor_", "computer_", "memory_")}
CLIENT_TOOLS = {
    "anthropic": {"custom"},
    "openai": {
        "function",
        "custom",
        "namespace",
        "local_shell",
        "shell",
        "apply_patch",
        "computer",
        "computer_use_preview",
    },
}
# Tools the provider runs that reach nothing outside the request (they search its own tool list).
INSIDE_TOOL_PREFIXES = {"anthropic": ("tool_search_tool_",), "openai": ("tool_search",)}
# Tools that run another model than the call's, priced as that model (or per image): never allowed.
OTHER_MODEL_TOOLS = ("advisor_", "image_generation")
# Tools the provider bills beside tokens, by what it bills: a web search per search (priced by the table's,
# or the config's, rate per 1,000 searches). A call that offers one goes upstream only at a price that has
# the rate (mlrb/models/prices.py's `Price.has_rate`).
FEE_TOOLS = {
    "anthropic": {"web_search_": "web_searches_kcount"},
    "openai": {"web_search": "web_searches_kcount"},
}  # Responses' web_search and web_search_preview
# Tools the provider bills beside tokens at rates no usage reports or the run does not price (a code
# container's hours or sessions, stored files' days): never allowed. So are Chat Completions' searches
# (`web_search_options`), billed per call by their context size, which its usage does not say.
UNPRICED_TOOLS = {"anthropic": ("code_execution_",), "openai": ("code_interpreter", "file_search")}
UNPRICED_FIELDS = {"openai": ("web_search_options",)}
# Request fields that have the provider reach outside the request for the agent.
NETWORK_FIELDS = {"anthropic": ("mcp_servers", "container"), "openai": ("web_search_options",)}
URL_KEYS = ("url", "image_url", "file_url")  # where a content part names what the provider fetches
NOT_CONTENT = ("tools", "metadata", "action")  # tool schemas, the agent's labels, what the model did: fetched by no one
URL_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*:", re.IGNORECASE)
# The tiers a call may ask for, by provider and field: each value -> the tier it is billed at, as the
# price table's context (mlrb/models/prices.py; {}: the standard rates). Any other value is refused:
# OpenAI's scale tier (billed from units bought ahead), an Anthropic region pinned (billed at a premium
# the table does not price), Anthropic's service_tier values beside these.
TIERS: dict[tuple[str, str], dict[Any, dict[str, str]]] = {
    ("anthropic", "service_tier"): {None: {}, "auto": {}, "standard_only": {}},
    ("anthropic", "speed"): {None: {}, "standard": {}, "fast": {"speed": "fast"}},  # fast: a multiple of the rate
    ("anthropic", "inference_geo"): {None: {}, "global": {}},
    ("openai", "service_tier"): {
        None: {},
        "auto": {},
        "default": {},
        "flex": {"service_tier": "flex"},
        "priority": {"service_tier": "priority"},
        "fast": {"service_tier": "fast"},
    },
}
CHEAPER = ({"service_tier": "flex"},)  # tiers billed below the standard rates: without the table's, charged those
# The tiers a provider says it served a call at (mlrb/models/api_shapes.py's `tier_of`), by field: each -> its
# price context. A tier not here (OpenAI's scale, Anthropic's priority capacity) is the standard rates'.
SERVED: dict[str, dict[str, dict[str, dict[str, str]]]] = {
    "anthropic": {"speed": {"standard": {}, "fast": {"speed": "fast"}}},
    "openai": {
        "service_tier": {
            "default": {},
            "flex": {"service_tier": "flex"},
            "priority": {"service_tier": "priority"},
            "fast": {"service_tier": "fast"},
        }
    },
}


class Ambiguous(ValueError):
    """A body that JSON parsers may read differently."""


def parse_body(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """The request in RAW, or None and why it is refused: not UTF-8 JSON (a byte-order mark, another
    encoding, nesting past the parser's depth), not an object, a key twice in one object (Python
    keeps the last, other parsers the first or refuse it), two keys the rules read that differ only
    in case, or a number JSON has no value for (NaN, Infinity, 1e400). An empty body is an empty
    object, as the proxy has always read it."""
    if not raw:
        return {}, None
    try:
        request = json.loads(
            raw.decode("utf-8"), object_pairs_hook=unique_keys, parse_constant=no_constant, parse_float=finite
        )
    except Ambiguous as e:
        return None, f"mlrb proxy: the body is ambiguous: {e}"
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None, "mlrb proxy: the body is not JSON (UTF-8, within the parser's depth)"
    if not isinstance(request, dict):
        return None, "mlrb proxy: the body is not a JSON object"
    if depth_of(request) > MAX_DEPTH:  # the rules read it recursively, and write it out again
        return None, f"mlrb proxy: the body is nested deeper than {MAX_DEPTH} levels"
    return request, None


def depth_of(value: Any) -> int:
    """How deep VALUE's lists and objects nest (a scalar: 0)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            pending.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    read = dict(pairs)
    if len(read) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise Ambiguous(f"the key {key!r} is given twice in one object")
            seen.add(key)
    ruled: dict[str, str] = {}  # of the keys the rules read, each folded -> the key
    for key in read:
        folded = key.casefold()
        if folded in RULE_KEYS:
            if folded in ruled:
                raise Ambiguous(f"the keys {ruled[folded]!r} and {key!r} differ only in case")
            ruled[folded] = key
    return read


def no_constant(name: str) -> Any:
    raise Ambiguous(f"{name} is not a JSON number")


def finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise Ambiguous(f"{text} is past what a JSON number can hold")
    return number


def canonical_body(request: dict[str, Any]) -> bytes:
    """REQUEST as the bytes that go upstream: the object the proxy read and checked, written out
    again (ASCII, so no charset can read it otherwise; compact, so the call holds no more budget
    than its content)."""
    return json.dumps(request, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def check_request(provider: str, request: dict[str, Any], network_allowed: bool) -> str | None:
    """Why the proxy refuses REQUEST to PROVIDER ("anthropic", "openai"), or None when it may go
    upstream. NETWORK_ALLOWED: whether the run's task lets the agent reach the network (its rules:
    `network`); without it, what the provider would reach for the agent is refused too."""
    for check in (shape, priced, out_of_sight):
        why = check(provider, request)
        if why is not None:
            return f"mlrb proxy: {why}"
    if not network_allowed:
        why = reaches_out(provider, request)
        if why is not None:
            return f"mlrb proxy: {why}; the run's task allows no network, so neither may its model calls"
    why = billed_unpriced(provider, request)
    return f"mlrb proxy: {why}" if why is not None else None


def billed_unpriced(provider: str, request: dict[str, Any]) -> str | None:
    """What has the provider bill the call beside its tokens at a rate the run cannot price: a code
    container, stored files, a search billed per call by its context size. (Without network these
    reach out too, and are refused as such first.)"""
    for name in UNPRICED_FIELDS.get(provider, ()):
        if request.get(name) is not None:
            return f"`{name}` is billed beside the call's tokens at a rate the run's budget does not price"
    for tool in tools_of(request):
        kind = str(tool.get("type") or "")
        hosted_shell = provider == "openai" and kind == "shell" and not runs_inside(provider, tool)
        if kind.startswith(UNPRICED_TOOLS.get(provider, ())) or hosted_shell:
            return f"the tool {kind!r} is billed beside the call's tokens at a rate the run's budget does not price"
    return None


def fees_of(provider: str, request: dict[str, Any]) -> dict[str, str]:
    """The fees beside tokens that REQUEST's tools may have the provider bill: each tool's type -> the
    rate that prices it (FEE_TOOLS)."""
    found = {}
    for tool in tools_of(request):
        kind = str(tool.get("type") or "")
        for prefix, rate in FEE_TOOLS.get(provider, {}).items():
            if kind.startswith(prefix):
                found[kind] = rate
    return found


def requested_tier(provider: str, request: dict[str, Any]) -> dict[str, str]:
    """The tier REQUEST asks for, as the price table's context ({}: the standard one); its fields
    passed `check_request`."""
    tier: dict[str, str] = {}
    for (api, name), allowed in TIERS.items():
        value = request.get(name)
        if api == provider and isinstance(value, str | None):
            tier.update(allowed.get(value, {}))
    return tier


def dearer(tier: Mapping[str, str]) -> bool:
    """Whether TIER costs more than the standard rates (any tier but the standard one and CHEAPER's)."""
    return bool(tier) and dict(tier) not in CHEAPER


def unpriced_tier(
    provider: str, request: dict[str, Any], model: str, prices_tier: Callable[[Mapping[str, str]], bool]
) -> str | None:
    """Why a call that asks for a tier dearer than the standard one is refused: MODEL's price has no
    rates for it (PRICES_TIER: mlrb/models/prices.py's `Price.prices_tier`), so the call would be
    charged less than it costs. One sentence: the field, the value, and the values the model allows."""
    for (api, name), allowed in TIERS.items():
        value = request.get(name)
        tier = allowed.get(value, {}) if api == provider and isinstance(value, str | None) else {}
        if dearer(tier) and not prices_tier(tier):
            valid = ", ".join(
                repr(v) for v, t in allowed.items() if v is not None and (not dearer(t) or prices_tier(t))
            )
            return (
                f"mlrb proxy: `{name}: {value!r}` is billed at a rate the run has no price for with model "
                f"{model!r} (the price table has none for it, or the agent's options set the model's prices); "
                f"valid: {valid}"
            )
    return None


def billed_tier(provider: str, requested: Mapping[str, str], reported: Mapping[str, str]) -> dict[str, str]:
    """The tier a call is billed at, as the price table's context: the one the provider REPORTED it
    served (mlrb/models/api_shapes.py's `tier_of`), field by field; where it reported none the run
    knows (SERVED), the one REQUESTED when that costs more than the standard one, else the standard."""
    tier: dict[str, str] = {}
    for name, served in SERVED.get(provider, {}).items():
        said = reported.get(name)
        if said in served:
            tier.update(served[said])
        elif name in requested and dearer({name: requested[name]}):
            tier[name] = requested[name]
    return tier


def tier_name(tier: Mapping[str, str]) -> str:
    """How a call's record names the tier it was billed at: "standard", or the provider's word ("priority",
    "flex", "fast")."""
    return "+".join(tier.values()) or "standard"


def shape(provider: str, request: dict[str, Any]) -> str | None:
    """The fields the proxy reads must be what it takes them for: else the upstream may read them
    otherwise (a max_tokens of 64000.0, say, that the hold ignores and a lenient server honours)."""
    if not isinstance(request.get("model", ""), str):
        return "`model` is not a string"
    if not isinstance(request.get("stream", False), bool | None):  # 1 is True to Python, not to every parser
        return "`stream` is not true or false"
    if not isinstance(request.get("stream_options", {}), dict | None):
        return "`stream_options` is not an object"
    for cap in OUTPUT_CAPS:
        value = request.get(cap)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            return f"`{cap}` is not a whole number"
    if not isinstance(request.get("tools", []), list | None):
        return "`tools` is not a list"
    return None


def priced(provider: str, request: dict[str, Any]) -> str | None:
    """What has the provider run or bill another model, or bill the call's at another rate, than the
    one the proxy checked and prices."""
    for (api, name), allowed in TIERS.items():
        value = request.get(name)
        if api == provider and (not isinstance(value, str | None) or value not in allowed):
            valid = ", ".join(repr(v) for v in allowed if v is not None)
            return f"`{name}: {value!r}` is billed at a rate the run's budget does not price (valid: {valid})"
    if provider == "anthropic" and request.get("fallbacks"):
        return "`fallbacks` would have other models answer than the one the run checked and prices"
    if provider == "openai" and request.get("prompt") is not None:
        return "`prompt` names a stored prompt whose model and tools the proxy cannot see"
    for tool in tools_of(request):
        kind = str(tool.get("type") or "")
        if "model" in tool or kind.startswith(OTHER_MODEL_TOOLS):
            return f"the tool {kind or tool.get('name')!r} runs another model than the call's, which the run does not price"
    return None


def out_of_sight(provider: str, request: dict[str, Any]) -> str | None:
    """What has the provider generate more than the call's answer holds: a background response
    (answered at once, queued, no usage; generated and billed later, and read by another call), or
    several answers (`n`) where the proxy holds one answer's worth of the budget."""
    if provider == "openai" and request.get("background"):
        return "`background: true` generates after the call has been answered and charged"
    n = request.get("n")
    if provider == "openai" and n is not None and (type(n) is not int or n != 1):  # not True, not 1.0
        return "`n` other than 1: the run holds one answer's worth of its budget for a call"
    return None


def reaches_out(provider: str, request: dict[str, Any]) -> str | None:
    """What has the provider reach outside the request for the agent: a tool it runs itself (web
    search or fetch, code execution, an MCP server, file search, a hosted shell), a request field
    that does (MCP servers, a code-execution container, web search options), or content it fetches
    from a URL (an image, a document, a file)."""
    for name in NETWORK_FIELDS.get(provider, ()):
        if request.get(name) not in (None, []):  # an empty object asks for it too (web_search_options: {})
            return f"`{name}` has the provider reach outside the call"
    for tool in tools_of(request):
        if not runs_inside(provider, tool):
            kind = tool.get("type")
            return f"the tool {kind!r} is run by the provider, outside the run's sandbox"
    url = fetched_url(request)
    if url is not None:
        return f"the provider would fetch {url[:100]!r} (send the content itself, e.g. as a data: URL)"
    return None


def tools_of(request: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The request's tool definitions, the tools a namespace groups included; an entry that is not
    an object counts as one with no type."""
    pending = list(request.get("tools") or [])
    while pending:
        tool = pending.pop()
        tool = tool if isinstance(tool, dict) else {"type": repr(tool)}
        if tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            pending.extend(tool["tools"])
        yield tool


def runs_inside(provider: str, tool: dict[str, Any]) -> bool:
    """Whether TOOL is the agent's to run (in its sandbox), or one the provider runs that reaches
    nothing outside the request. Any other type, a new one included, counts as reaching out."""
    kind = tool.get("type")
    if provider == "anthropic" and kind is None:  # a plain tool: its name, description and schema
        return True
    if not isinstance(kind, str):
        return False
    if kind == "shell":  # OpenAI's shell runs where its environment says: only "local" is the agent's
        environment = tool.get("environment")
        return environment is None or isinstance(environment, dict) and environment.get("type") == "local"
    return (
        kind in CLIENT_TOOLS.get(provider, set())
        or kind.startswith(CLIENT_TOOL_PREFIXES.get(provider, ()))
        or kind.startswith(INSIDE_TOOL_PREFIXES.get(provider, ()))
    )


def fetched_url(value: Any) -> str | None:
    """The first URL in VALUE's content that the provider would fetch: an Anthropic image or document
    whose source is a URL, an OpenAI image_url, input_image or input_file that names one (a data:
    URL carries its content and is fine). Tool definitions, metadata and what the model asked of a
    tool or did (its input, its action) are not content, and are not searched."""
    if isinstance(value, list):
        return next((u for u in map(fetched_url, value) if u is not None), None)
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    for key, item in value.items():
        if key in NOT_CONTENT or key == "input" and isinstance(kind, str) and kind.endswith("tool_use"):
            continue
        if key in URL_KEYS:
            url = item.get("url") if isinstance(item, dict) else item
            if isinstance(url, str) and URL_SCHEME.match(url.strip()) and not url.strip().lower().startswith("data:"):
                return url
        found = fetched_url(item)
        if found is not None:
            return found
    return None
