"""The judge's model: which one a review's config names (its provider, price and API key, checked before
a run starts), and its one call, made with the provider's official SDK (mlrb/models/providers.py's
adapters) through a metering proxy of its own (mlrb/models/proxy.py) that charges a budget of its own
(mlrb/core/budget.py). What the call used and cost comes back apart: it is never the agent's.

All of the judge's model access is here, so that it moves with the rest of the model code.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field

from mlrb.core.budget import Budget
from mlrb.core.config import BudgetConfig, ConfigError, ReviewConfig
from mlrb.models import prices
from mlrb.models.providers import AnthropicProvider, ApiError, Message, OpenAIProvider
from mlrb.models.proxy import PROVIDERS, Call, MeteringProxy, Upstream, upstream_url

KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}  # each provider's SDK's own variable
RETRIES = 2  # the proxy's upstream retries of a failed call (a 429, a 5xx): few, the run has ended
CUT_OFF = {"max_tokens", "length"}  # stop reasons of an answer cut at its token cap


@dataclass(frozen=True)
class JudgeModel:
    """The judge's model, where it is served and what it costs."""

    provider: str
    model: str
    price: prices.Price
    base_url: str  # the upstream's
    api_key: str = field(repr=False)


@dataclass
class Answer:
    """The judge's call: its text (None when no answer came), and what it used and cost."""

    text: str | None
    cut_off: bool = False  # the answer reached its token cap
    failure: str | None = None  # why no answer came, in one line
    over_budget: bool = False  # the judge's budget refused the call
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


def provider_of(model: str) -> str:
    """The provider whose price table lists MODEL; a one-line ConfigError when none does."""
    found = [p for p in PROVIDERS if prices.from_table(p, model) is not None]
    if not found:
        raise ConfigError(
            f"review.judge: model '{model}' is not in the {prices.TABLE} table for "
            f"{' or '.join(PROVIDERS)}: name one it prices (e.g. claude-sonnet-5, gpt-4o), or, for a "
            "server of your own, set review.judge_provider, review.judge_price_input_per_mtok and "
            "review.judge_price_output_per_mtok"
        )
    return found[0]


def resolve(cfg: ReviewConfig) -> JudgeModel:
    """The judge's model as CFG names it: its provider, its price, its key from the environment. A
    one-line ConfigError for an unknown provider or model, or a key that is not set."""
    model = str(cfg.judge)
    if cfg.judge_provider is not None and cfg.judge_provider not in PROVIDERS:
        raise ConfigError(
            f"unknown review.judge_provider '{cfg.judge_provider}'; valid choices: {', '.join(PROVIDERS)}"
        )
    given = (cfg.judge_price_input_per_mtok, cfg.judge_price_output_per_mtok)
    if (given[0] is None) != (given[1] is None):
        raise ConfigError(
            "review.judge_price_input_per_mtok and review.judge_price_output_per_mtok go together: "
            "set both (USD per million tokens), or neither for the price table's"
        )
    provider = cfg.judge_provider or provider_of(model)
    if given[0] is not None and given[1] is not None:
        price = prices.flat(provider, model, given[0], given[1], "review.judge_price_*")
    else:
        price_found = prices.from_table(provider, model)
        if price_found is None:
            raise ConfigError(
                f"review.judge: model '{model}' has no price in the {prices.TABLE} table for {provider}: "
                "set review.judge_price_input_per_mtok and review.judge_price_output_per_mtok "
                "(USD per million tokens; 0 for a model that costs nothing)"
            )
        price = price_found
    env = cfg.judge_api_key_env or KEY_ENV[provider]
    key = os.environ.get(env, "").strip()
    if not key:
        raise ConfigError(
            f"review.judge={model} needs an API key: set the environment variable {env} "
            "(or name another with review.judge_api_key_env)"
        )
    return JudgeModel(provider, model, price, upstream_url(provider, cfg.judge_base_url), key)


def check_config(cfg: ReviewConfig) -> None:
    """The config's check (mlrb/core/config.py's check_review): the judge can be called."""
    resolve(cfg)


def budget_of(cfg: ReviewConfig) -> BudgetConfig:
    """The judge's own budget, as the metering proxy charges one: one step, its dollars and tokens,
    its time."""
    return BudgetConfig(
        name="review_judge",
        wall_time_s=cfg.judge_timeout_s,
        max_steps=1,
        max_input_tokens=cfg.judge_max_input_tokens,
        max_output_tokens=cfg.judge_max_output_tokens,
        max_usd=cfg.judge_max_usd,
    )


def ask(judge: JudgeModel, cfg: ReviewConfig, system: str, prompt: str, answer_tokens: int) -> Answer:
    """One call of the judge's model: SYSTEM and PROMPT, an answer of at most ANSWER_TOKENS tokens.
    Never raises for the model's or the provider's sake: a failure is the answer's `failure`."""
    meter = Budget(budget_of(cfg))
    calls: list[Call] = []
    token = secrets.token_urlsafe(24)  # the proxy's key for this one call: worth nothing elsewhere
    upstream = Upstream(judge.base_url, judge.api_key, models={judge.model: judge.price})
    with MeteringProxy(
        {judge.provider: upstream},
        token,
        meter=meter,
        on_call=calls.append,
        max_retries=RETRIES,
        request_timeout_s=cfg.judge_timeout_s,
    ) as proxy:
        client: AnthropicProvider | OpenAIProvider
        if judge.provider == "anthropic":
            client = AnthropicProvider(token, proxy.base_url("anthropic"), None, shown_as=judge.base_url)
        else:
            client = OpenAIProvider(
                token, proxy.base_url("openai"), None, "max_completion_tokens", 0, shown_as=judge.base_url
            )
        request = client.request(judge.model, system, [Message("user", prompt)], [], answer_tokens)
        request.pop("tools", None)  # the judge answers in text; an empty tool list is refused by some APIs
        try:
            reply = client.call(request, cfg.judge_timeout_s)
            answer = Answer(reply.text, cut_off=reply.stop_reason in CUT_OFF)
        except ApiError as e:
            answer = Answer(None, failure=str(e).replace(judge.api_key, "***"), over_budget=proxy.refused is not None)
    answer.input_tokens, answer.output_tokens, answer.cost_usd = meter.input_tokens, meter.output_tokens, meter.usd
    return answer


def input_usd_per_char(judge: JudgeModel, chars_per_token: float) -> float:
    """About what a character of the prompt costs (its tokens at the input rate)."""
    return judge.price.usd(1_000_000, 0) / 1_000_000 / chars_per_token


def answer_usd(judge: JudgeModel, answer_tokens: int) -> float:
    """The most an answer of ANSWER_TOKENS tokens costs."""
    return judge.price.usd(0, answer_tokens)
