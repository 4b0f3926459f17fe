"""What a model call costs: a price for each provider and model.

The table is genai-prices (pydantic's maintained table of LLM API prices, pinned in
requirements.lock). Its data ships inside the package, and nothing here asks it to update
itself, so no price is fetched at run time. It prices a call as the provider bills it on the
day of the call, tiers included (Claude Sonnet 4.5 costs twice as much past 200k input tokens),
each kind of token at its own rate: a token read from the provider's prompt cache costs about a tenth
of a plain input token, one written to it a quarter more (twice as much for Anthropic's one-hour
cache), as the provider reported them (mlrb/models/api_shapes.py's `Usage`). A call served at another
tier is priced at that tier's rates where the table has them: OpenAI's priority tier costs more and
its flex tier less, Anthropic's fast mode a multiple of the standard rate. The tier is the
table's price context (e.g. {"service_tier": "priority"}, {"speed": "fast"}); mlrb/models/request_rules.py
says which tier a call is billed at.

An agent's config may set rates instead (USD per million tokens, `CONFIG_RATES`): each overrides
the table's, and a model the table does not know (a local server's, say) needs an input and an
output rate. A price with a config rate has no dearer tier (`prices_tier`): which of its rates a
tier would change is not the config's to say, so a call may not ask for one. The library is imported
only when a price is looked up, so composing a config stays fast.

The table keeps a model's price after its provider retires it. `RETIRED` says which models the
providers have retired, or will soon: the one list the configs' defaults are checked against,
and what a run's "model not found" error quotes.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from mlrb.core.messages import ConfigError
from mlrb.models.api_shapes import Usage

TABLE = "genai-prices"

# Models their provider has retired (its API answers 404 for them) or has announced it will
# retire, with the day: provider -> model ID -> YYYY-MM-DD. Aliases and dated IDs alike.
RETIRED: dict[str, dict[str, str]] = {
    "anthropic": {
        "claude-3-5-sonnet-20240620": "2025-10-22",  # the MLRB paper's model
        "claude-3-5-sonnet-20241022": "2025-10-22",
        "claude-sonnet-4-20250514": "2026-06-15",
        "claude-sonnet-4-0": "2026-06-15",
        "claude-opus-4-20250514": "2026-06-15",
        "claude-opus-4-0": "2026-06-15",
        "claude-sonnet-4-5": "2026-11-30",
        "claude-sonnet-4-5-20250929": "2026-11-30",
    },
}


def retired_on(provider: str, model: str) -> str | None:
    """The day PROVIDER retired MODEL, or will (YYYY-MM-DD); None when it has said nothing."""
    return RETIRED.get(provider, {}).get(model)


@dataclass(frozen=True)
class Charge:
    """What a call costs, by what it paid for (USD)."""

    input_usd: float = 0.0  # the prompt: plain input, cache reads and cache writes, each at its rate
    output_usd: float = 0.0
    fee_usd: float = 0.0  # what the provider bills beside tokens (a web search, a fee per request)

    @property
    def usd(self) -> float:
        return self.input_usd + self.output_usd + self.fee_usd


# A config's price keys (agent.options.price_<key>) -> the table's rate each sets, in genai-prices' names.
CONFIG_RATES = {
    "input_per_mtok": "input_mtok",  # USD per million tokens of plain input
    "output_per_mtok": "output_mtok",
    "cache_read_per_mtok": "cache_read_mtok",  # of tokens read from the prompt cache
    "cache_write_per_mtok": "cache_write_mtok",  # written to it (Anthropic's five-minute cache)
    "cache_write_1h_per_mtok": "cache_write_1h_mtok",  # written to Anthropic's one-hour cache
    "per_1k_web_searches": "web_searches_kcount",  # USD per 1,000 web searches the provider runs for a call
}
CONFIG_KEYS = tuple(f"price_{key}" for key in CONFIG_RATES)  # as agent.options and a command's providers name them


def config_rates(options: Any) -> dict[str, float | None]:
    """The rates an agent's options set (None: the table's), by CONFIG_RATES' keys."""
    return {key: getattr(options, f"price_{key}", None) for key in CONFIG_RATES}


@dataclass(frozen=True)
class Price:
    """One model's price, and where it comes from."""

    provider: str
    model: str
    input_per_mtok: float  # USD per million tokens (the table's base rate; its tiers apply in `charge`)
    output_per_mtok: float
    source: str  # e.g. "genai-prices 0.2.3, anthropic claude-3-5-sonnet, as of 2026-11-28", or the config's keys
    table_entry: Any = None  # (genai-prices' provider, model) when the table prices it
    # The config's rates, by the table's names (CONFIG_RATES' values): each replaces the table's. A price
    # without a table has these alone: a kind of token it has no rate for is input, at the input rate.
    rates: tuple[tuple[str, float], ...] = ()

    def usd(self, input_tokens: int, output_tokens: int, tier: Mapping[str, str] | None = None) -> float:
        """What a call with these tokens, none of them cached, costs at TIER."""
        return self.charge(Usage(input_tokens, output_tokens), tier).usd

    def charge(self, usage: Usage, tier: Mapping[str, str] | None = None) -> Charge:
        """What a call that used USAGE costs, each kind of token at its rate, the table's long-prompt tiers
        applied, at TIER: the table's price context, the rates of its variant for it (None or {}: the
        standard rates). A price with config rates has none: it charges its rates at any tier."""
        from decimal import Decimal

        from genai_prices import Usage as TableUsage
        from genai_prices.types import ModelPrice

        counted = TableUsage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            cache_write_1h_tokens=usage.cache_write_1h_tokens,
            web_searches=usage.web_searches,
        )
        now = datetime.datetime.now(datetime.UTC)
        if self.table_entry is not None and not self.rates:
            provider, model = self.table_entry
            table = model.calc_price(counted, provider, genai_request_timestamp=now, price_context=dict(tier or {}))
            priced = {
                "input_price": table.input_price,
                "output_price": table.output_price,
                "total_price": table.total_price,
            }
        else:
            table_rates = vars(self.table_entry[1].get_prices(now)) if self.table_entry is not None else {}
            given = {**table_rates, **{key: Decimal(str(rate)) for key, rate in self.rates}}
            if given.get("cache_write_1h_mtok") is not None and given.get("cache_write_mtok") is None:
                given["cache_write_mtok"] = given.get("input_mtok")  # the table needs both: a write at no rate is input
            priced = dict(ModelPrice(**given).calc_price(counted))
        paid_in, paid_out = priced["input_price"], priced["output_price"]  # Decimals: the fee is exactly the rest
        return Charge(float(paid_in), float(paid_out), float(priced["total_price"] - paid_in - paid_out))

    def prices_tier(self, tier: Mapping[str, str]) -> bool:
        """Whether this price has rates of its own for a call at TIER (the table's price context, e.g.
        {"service_tier": "priority"}): the standard tier ({}) always; another only from the table, with
        no config rate, where the table has a variant for TIER in force today that sets a rate."""
        if not tier:
            return True
        if self.table_entry is None or self.rates:
            return False
        now = datetime.datetime.now(datetime.UTC)
        for variant in self.table_entry[1].price_variants or ():
            if variant.constraint is not None and not variant.constraint.active(now):
                continue
            if variant.when == dict(tier) and any(v is not None for v in vars(variant.prices).values()):
                return True
        return False

    def has_rate(self, rate: str) -> bool:
        """Whether this price sets RATE (the table's name, e.g. web_searches_kcount): a fee it has no
        rate for cannot be charged."""
        if any(key == rate for key, _ in self.rates):
            return True
        if self.table_entry is None:
            return False
        return getattr(self.table_entry[1].get_prices(datetime.datetime.now(datetime.UTC)), rate, None) is not None


def flat(provider: str, model: str, input_per_mtok: float, output_per_mtok: float, source: str) -> Price:
    """A price set by hand: one rate for every input token, one for every output token."""
    return Price(
        provider,
        model,
        float(input_per_mtok),
        float(output_per_mtok),
        source,
        None,
        (("input_mtok", float(input_per_mtok)), ("output_mtok", float(output_per_mtok))),
    )


def from_table(provider: str, model: str) -> Price | None:
    """The table's price of PROVIDER's MODEL today, or None when the table does not know it."""
    import genai_prices
    from genai_prices import data_snapshot

    try:
        found_provider, found = data_snapshot.get_snapshot().find_provider_model(model, None, provider, None)
    except LookupError:
        return None
    if found_provider.id != provider:  # priced as another provider's model: not this API's bill
        return None
    today = datetime.datetime.now(datetime.UTC)
    rates = found.get_prices(today)
    where = ", ".join(found_provider.pricing_urls or [])
    source = f"{TABLE} {genai_prices.__version__}, {provider} {found.id} ({where}), as of {today.date().isoformat()}"
    return Price(
        provider, model, base_rate(rates.input_mtok), base_rate(rates.output_mtok), source, (found_provider, found)
    )


def base_rate(rate: Any) -> float:
    """A rate of the table as a number: a tiered one's first tier."""
    return float(getattr(rate, "base", rate) or 0)


def price_of(
    provider: str,
    model: str,
    input_per_mtok: float | None,
    output_per_mtok: float | None,
    keys: str,
    **more: float | None,
) -> Price:
    """MODEL's price: each rate the config sets (KEYS is where, e.g. "agent.options"; MORE, the rates
    beside input and output, by CONFIG_RATES' keys), the table's for the rest. A config that sets
    both the input and the output rate prices the model alone, the table unread: a cached token it
    sets no rate for costs the input rate. A one-line ConfigError when there is no price."""
    given = {
        key: value
        for key, value in {"input_per_mtok": input_per_mtok, "output_per_mtok": output_per_mtok, **more}.items()
        if value is not None
    }
    rates = tuple((CONFIG_RATES[key], float(value)) for key, value in given.items())
    named = ", ".join(f"{keys}.price_{key}" for key in given)
    if input_per_mtok is not None and output_per_mtok is not None:
        return Price(provider, model, float(input_per_mtok), float(output_per_mtok), named, None, rates)
    table = from_table(provider, model)
    if table is None:
        missing = " and ".join(
            f"{keys}.price_{side}_per_mtok"
            for side, value in (("input", input_per_mtok), ("output", output_per_mtok))
            if value is None
        )
        raise ConfigError(
            f"model '{model}' has no price in the {TABLE} table for {provider}: set {missing} "
            "(USD per million tokens; 0 for a model that costs nothing)"
        )
    if not rates:
        return table
    return replace(
        table,
        input_per_mtok=table.input_per_mtok if input_per_mtok is None else float(input_per_mtok),
        output_per_mtok=table.output_per_mtok if output_per_mtok is None else float(output_per_mtok),
        source=f"{named}, the rest from {table.source}",
        rates=rates,
    )
