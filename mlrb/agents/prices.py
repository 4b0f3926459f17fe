"""What a model call costs: a price for each provider and model.

The table is genai-prices (pydantic's maintained table of LLM API prices, pinned in
requirements.lock). Its data ships inside the package, and nothing here asks it to update
itself, so no price is fetched at run time. It prices a call as the provider bills it on the
day of the call, tiers included (Claude Sonnet 4.5 costs twice as much past 200k input tokens).

An agent's config may set a price instead (USD per million tokens): it overrides the table,
and a model the table does not know (a local server's, say) needs one. The library is imported
only when a price is looked up, so composing a config stays fast.

The table keeps a model's price after its provider retires it. `RETIRED` says which models the
providers have retired, or will soon: the one list the configs' defaults are checked against,
and what a run's "model not found" error quotes.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from mlrb.core.messages import ConfigError

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
class Price:
    """One model's price, and where it comes from."""

    provider: str
    model: str
    input_per_mtok: float  # USD per million tokens (the table's base rate; its tiers apply in `usd`)
    output_per_mtok: float
    source: str  # e.g. "genai-prices 0.2.3, anthropic claude-3-5-sonnet, as of 2026-11-28", or the config's keys
    table_entry: Any = None  # (genai-prices' provider, model) when the price is the table's

    def usd(self, input_tokens: int, output_tokens: int) -> float:
        """What a call with these tokens costs."""
        if self.table_entry is None:
            return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6
        from genai_prices import Usage

        provider, model = self.table_entry
        now = datetime.datetime.now(datetime.UTC)
        usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens)
        return float(model.calc_price(usage, provider, genai_request_timestamp=now).total_price)


def flat(provider: str, model: str, input_per_mtok: float, output_per_mtok: float, source: str) -> Price:
    """A price set by hand: the same rate for every token."""
    return Price(provider, model, float(input_per_mtok), float(output_per_mtok), source)


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
    return Price(provider, model, base_rate(rates.input_mtok), base_rate(rates.output_mtok), source,
                 (found_provider, found))  # fmt: skip


def base_rate(rate: Any) -> float:
    """A rate of the table as a number: a tiered one's first tier."""
    return float(getattr(rate, "base", rate) or 0)


def price_of(provider: str, model: str, input_per_mtok: float | None, output_per_mtok: float | None,
             keys: str) -> Price:  # fmt: skip
    """MODEL's price: the config's where it sets one (KEYS is where, e.g. "agent.options"), the
    table's otherwise; a one-line ConfigError when there is none."""
    if input_per_mtok is not None and output_per_mtok is not None:
        return flat(provider, model, input_per_mtok, output_per_mtok, f"{keys}.price_*_per_mtok")
    table = from_table(provider, model)
    if table is None:
        missing = " and ".join(f"{keys}.price_{side}_per_mtok" for side, value in
                               (("input", input_per_mtok), ("output", output_per_mtok)) if value is None)  # fmt: skip
        raise ConfigError(f"model '{model}' has no price in the {TABLE} table for {provider}: set {missing} "
                          "(USD per million tokens; 0 for a model that costs nothing)")  # fmt: skip
    if input_per_mtok is None and output_per_mtok is None:
        return table
    return flat(provider, model, table.input_per_mtok if input_per_mtok is None else input_per_mtok,
                table.output_per_mtok if output_per_mtok is None else output_per_mtok,
                f"{keys}.price_*_per_mtok, the rest from {table.source}")  # fmt: skip
