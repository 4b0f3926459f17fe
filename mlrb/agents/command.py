"""Bring your own agent (`agent=command`): any program that speaks the Anthropic Messages API
or OpenAI Chat Completions or Responses, run in the sandbox on the task's prompt.

The harness runs the run's metering proxy (mlrb/models/proxy.py) and gives the program, in its
environment, the proxy as its API's base URL and the run's token as its key:

    ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY       OPENAI_BASE_URL, OPENAI_API_KEY
    MLRB_PROMPT                                 the task's prompt (as the built-in agent gets it)
    MLRB_MODEL                                  agent.options.model: the model to call (the command may
                                                name it: claude --model "$MLRB_MODEL")
    MLRB_AGENT_DIR                              agent.options.program_dir: your program's files (read-only)
    MLRB_STATE_DIR                              a folder of its own, kept across the run's attempts
    MLRB_RESUMED, MLRB_ATTEMPT                  a run that goes on after its process died (mlrb/run_files/resume.py):
    MLRB_RESUME_NOTE                            1, the attempt, and what to tell the agent as it goes on
    MLRB_BUDGET_FILE                            what is left of its budget, always current (mlrb/harness/agent_clock.py)

The real keys stay with the proxy. The proxy meters every call, each model at its own price,
refuses a model the config does not allow (`agent.options.model`, and the side models that
`agent.options.providers.<provider>.models` lists), and refuses calls once the budget's tokens
or dollars are spent; the harness's clock kills the program at the wall-time limit. The run
ends `ok` when the program exits 0, `budget_exhausted` when a limit stopped it (a refused call,
or the clock), `agent_error` otherwise; a provider that has no model the config allows ends it
as a configuration error (metering.ModelNotFound). Each model call is an event of the run (its
trajectory, trace and metrics), as the proxy saw it (mlrb/models/metering.py).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from mlrb.agents.base import Agent, AgentContext, AgentOutcome
from mlrb.agents.baseline import Says, command_outcome, one_command_step
from mlrb.agents.conversation import resumed_note
from mlrb.core.config import AgentConfig, ConfigError
from mlrb.core.status import Status
from mlrb.models import metering, prices
from mlrb.models.proxy import PROVIDERS, MissingModel, Upstream, upstream_url
from mlrb.sandbox.base import ExecResult

TOOL, CALL_ID = "command", "command"


@dataclass
class ProviderOptions:
    # The environment variable holding this provider's API key: the proxy reads it; the program never sees it.
    api_key_env: str
    # The models the program may call here besides agent.options.model (its side models); any other is refused.
    models: list[str] = field(default_factory=list)
    base_url: str | None = None  # None: $ANTHROPIC_BASE_URL / $OPENAI_BASE_URL, else the provider's
    # USD per million tokens, for every model listed: None, the price table's (mlrb/models/prices.py)
    price_input_per_mtok: float | None = None
    price_output_per_mtok: float | None = None
    price_cache_read_per_mtok: float | None = None  # of the prompt read from the provider's cache
    price_cache_write_per_mtok: float | None = None  # written to it (five minutes)
    price_cache_write_1h_per_mtok: float | None = None  # written to Anthropic's one-hour cache
    price_per_1k_web_searches: float | None = None  # USD per 1,000 web searches the provider runs


@dataclass
class InstallOptions:
    npm: str  # the package and its exact version, e.g. @anthropic-ai/claude-code@2.1.328
    bin: dict[str, str]  # the program's name on the agent's PATH -> its file in the installed folder


@dataclass
class CommandOptions:
    # The shell command that runs the agent's program in the workspace (its prompt in $MLRB_PROMPT).
    command: str = ""
    model: str | None = None  # the program's model ($MLRB_MODEL), allowed at the provider that serves it
    # The model APIs the program may call, by name (anthropic, openai): each through the metering proxy.
    providers: dict[str, ProviderOptions] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)  # more variables for the program
    # A program installed from npm into the asset cache before the run (say Claude Code); null: none.
    install: InstallOptions | None = None
    program_dir: Path | None = None  # your program's files on this machine: read-only in the sandbox, $MLRB_AGENT_DIR


OPTION_KEYS = ("command", "model", "providers", "environment", "install", "program_dir")
EXAMPLE_MODELS = {"anthropic": "claude-sonnet-5", "openai": "gpt-5"}


def parse_options(cfg: AgentConfig) -> CommandOptions:
    options = dict(cfg.options or {})
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown key agent.options.{unknown[0]} for agent kind 'command'; valid: {', '.join(OPTION_KEYS)}"
        )
    command = options.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ConfigError(
            "agent=command needs the program to run: agent.options.command='python my_agent.py' "
            "(it runs in the workspace, with the proxy's address and token in its environment)"
        )
    providers: dict[str, ProviderOptions] = {}
    for name, values in (options.get("providers") or {}).items():
        if name not in PROVIDERS:
            raise ConfigError(f"unknown provider agent.options.providers.{name}; valid: anthropic, openai")
        try:
            providers[name] = ProviderOptions(**dict(values))
        except TypeError as e:
            raise ConfigError(f"agent.options.providers.{name}: {e}") from None
        for price in prices.CONFIG_KEYS:
            value = getattr(providers[name], price)
            if value is not None and (not isinstance(value, (int, float)) or not value >= 0):
                raise ConfigError(f"agent.options.providers.{name}.{price} must be a price of 0 or more, not {value!r}")
        models = providers[name].models
        if isinstance(models, str) or not all(isinstance(m, str) and m.strip() for m in models or ()):
            raise ConfigError(
                f"agent.options.providers.{name}.models must list the models the program may call, "
                f"e.g. [{EXAMPLE_MODELS[name]}], not {models!r}"
            )
        providers[name].models = list(models or ())
    model = options.get("model")
    if model is not None:
        if not isinstance(model, str) or not model.strip() or model != model.strip():
            raise ConfigError(
                f"agent.options.model must name a model, e.g. {EXAMPLE_MODELS['anthropic']}, not {model!r}"
            )
        serving = providers[provider_of(model, providers)]
        serving.models = [model, *(m for m in serving.models if m != model)]
    elif "MLRB_MODEL" in command:
        raise ConfigError(
            "agent.options.command names $MLRB_MODEL, and agent.options.model is not set: "
            f"name the model, e.g. agent.options.model={EXAMPLE_MODELS['anthropic']}"
        )
    if providers and not any(provider.models for provider in providers.values()):
        name = next(iter(providers))
        raise ConfigError(
            f"agent.options.providers.{name}.models must list the models the program may call, "
            f"e.g. [{EXAMPLE_MODELS[name]}], or agent.options.model name one, not []"
        )
    install = None
    if options.get("install"):
        values = dict(options["install"])
        if not isinstance(values.get("npm"), str) or not values.get("bin"):
            raise ConfigError("agent.options.install needs npm (NAME@VERSION) and bin ({name: file in the package})")
        install = InstallOptions(npm=values["npm"], bin={str(k): str(v) for k, v in dict(values["bin"]).items()})
    environment = {str(k): str(v) for k, v in dict(options.get("environment") or {}).items()}
    program_dir = None
    if options.get("program_dir"):
        program_dir = Path(str(options["program_dir"])).expanduser().resolve()
        if not program_dir.is_dir():
            raise ConfigError(
                f"agent.options.program_dir {options['program_dir']} is not a folder on this machine: "
                "give the folder holding your program's files"
            )
        if install is not None:
            raise ConfigError(
                "agent.options.program_dir and agent.options.install cannot both be given: "
                "the sandbox mounts one folder of the agent's programs"
            )
    return CommandOptions(
        command=command,
        model=model,
        providers=providers,
        environment=environment,
        install=install,
        program_dir=program_dir,
    )


def provider_of(model: str, providers: dict[str, ProviderOptions]) -> str:
    """Which configured provider serves agent.options.model: the one whose models list it, else
    the only one, else the one whose price table knows it; a one-line ConfigError otherwise."""
    listed = [name for name, provider in providers.items() if model in provider.models]
    if listed:
        return listed[0]
    if len(providers) == 1:
        return next(iter(providers))
    known = [name for name in providers if prices.from_table(name, model) is not None]
    if len(known) == 1:
        return known[0]
    where = " or ".join(f"agent.options.providers.{name}.models" for name in providers) or "agent.options.providers"
    raise ConfigError(f"agent.options.model={model}: say which provider serves it, listing it in {where}")


def upstreams_of(agent: str, options: CommandOptions) -> dict[str, Upstream]:
    """The providers whose key is in the environment, with where their calls go and the models
    the program may call there, each at its price (a one-line ConfigError for a model with none)."""
    found = {}
    for name, provider in options.providers.items():
        key = os.environ.get(provider.api_key_env)
        if key:
            models = {model: price_of(name, model, provider) for model in provider.models}
            found[name] = Upstream(upstream_url(name, provider.base_url), key, models=models)
    if not found:
        names = " or ".join(f"${p.api_key_env}" for p in options.providers.values()) or "(no providers configured)"
        raise ConfigError(
            f"agent {agent} needs an API key: set {names} (the run's proxy holds it; "
            "the program gets the run's token instead)"
        )
    return found


def price_of(name: str, model: str, provider: ProviderOptions) -> prices.Price:
    """MODEL's price at provider NAME: the rates its options set, the table's for the rest."""
    rates = prices.config_rates(provider)
    return prices.price_of(
        name,
        model,
        rates.pop("input_per_mtok"),
        rates.pop("output_per_mtok"),
        f"agent.options.providers.{name}",
        **rates,
    )


COMMAND_SAYS = Says("the command ran out of time", "the command exited", "the command finished")


class CommandAgent(Agent):
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.options = parse_options(cfg)
        self.upstreams = upstreams_of(cfg.name, self.options)
        # The agent's programs, read-only in the sandbox at the same path: the installed
        # program's folder, once `prepare` has it, or the user's own (program_dir).
        self.tools_dir: Path | None = self.options.program_dir

    @classmethod
    def check_config(cls, cfg: AgentConfig) -> None:
        upstreams_of(cfg.name, parse_options(cfg))

    def prepare(self, cache_dir: Path) -> None:
        """Install the program (`agent.options.install`) into the cache if it is not there yet;
        ConfigError in one line when it cannot be. The harness calls it before the run exists."""
        install = self.options.install
        if install is not None:
            from mlrb.agents import installed

            self.tools_dir = installed.ensure(self.cfg.name, install.npm, install.bin, cache_dir)

    def model_upstreams(self) -> dict[str, Upstream]:
        """What the run's metering proxy serves this agent (the harness starts it)."""
        return self.upstreams

    def run(self, ctx: AgentContext) -> AgentOutcome:
        if ctx.model is None or ctx.sandbox.model_url is None:
            raise RuntimeError("agent=command needs the run's metering proxy, and the run started none")
        limit = ctx.budget.exhausted()
        if limit:
            return AgentOutcome(Status.BUDGET_EXHAUSTED, limit, "no budget left before the command started")
        url, token = ctx.sandbox.model_url, ctx.model.token
        given = {
            "ANTHROPIC_BASE_URL": f"{url}/anthropic",
            "ANTHROPIC_API_KEY": token,
            "OPENAI_BASE_URL": f"{url}/openai/v1",
            "OPENAI_API_KEY": token,
            "MLRB_PROMPT": ctx.instructions,
            **({"MLRB_MODEL": self.options.model} if self.options.model else {}),
            **({"MLRB_AGENT_DIR": str(self.options.program_dir)} if self.options.program_dir else {}),
            **resumed_variables(ctx),
        }
        configured = dict(self.options.environment)  # these may refer to variables ($TMPDIR, $PATH)
        if self.options.install is not None and self.tools_dir is not None:
            configured["PATH"] = f"{self.tools_dir / 'bin'}:$PATH"
        exports = " ".join(
            [
                *(f"{k}={shlex.quote(v)}" for k, v in given.items()),
                *(f"{k}={expanding(v)}" for k, v in configured.items()),
            ]
        )

        def keep_transcript(result: ExecResult) -> None:  # whole (the trajectory keeps a cut copy)
            if ctx.run_dir is not None:
                (ctx.run_dir / "agent").mkdir(exist_ok=True)
                attempt = f".attempt-{ctx.resumed.attempt}" if ctx.resumed else ""  # each attempt's own
                (ctx.run_dir / "agent" / f"stdout{attempt}.txt").write_text(result.stdout)
                (ctx.run_dir / "agent" / f"stderr{attempt}.txt").write_text(result.stderr)

        outcome = one_command_step(
            ctx,
            TOOL,
            CALL_ID,
            {"command": self.options.command},
            f"export {exports}; {self.options.command}",
            lambda result: self.outcome(ctx, result, ctx.model.refused),
            on_result=keep_transcript,
        )
        missing = metering.model_not_found(ctx.model, self.how_to_set(ctx.model.missing_model))
        if missing is not None:  # the provider has no model the config allows: the config's fault, not the program's
            raise missing
        return outcome

    def how_to_set(self, missing: MissingModel | None) -> str:
        """How to name another model in place of the one the provider lacks."""
        if missing is None or missing.model == self.options.model:
            return metering.SET_MODEL
        return (
            f"set the program's model with agent.options.model=NAME, and its side models in "
            f"agent.options.providers.{missing.provider}.models (and where the command names them)"
        )

    @staticmethod
    def outcome(ctx: AgentContext, result: ExecResult, refused: str | None) -> AgentOutcome:
        if refused:
            return AgentOutcome(Status.BUDGET_EXHAUSTED, refused, f"the proxy refused a model call: {refused}")
        return command_outcome(ctx, result, COMMAND_SAYS)


def resumed_variables(ctx: AgentContext) -> dict[str, str]:
    """A resumed run's: MLRB_RESUMED=1, its attempt, and a note to give the agent as its prompt
    (the program's own state is in $MLRB_STATE_DIR, kept across attempts)."""
    if ctx.resumed is None:
        return {}
    return {
        "MLRB_RESUMED": "1",
        "MLRB_ATTEMPT": str(ctx.resumed.attempt),
        "MLRB_RESUME_NOTE": resumed_note(ctx.resumed.why, ctx.resumed.attempt),
    }


def expanding(value: str) -> str:
    """A shell word for a configured VALUE: double-quoted where it refers to variables ($NAME),
    so they expand (`PATH: /tools/bin:$PATH`), else single-quoted."""
    if re.search(r"\$[A-Za-z_{]", value) and not re.search(r'["`\\]', value):
        return f'"{value}"'
    return shlex.quote(value)
