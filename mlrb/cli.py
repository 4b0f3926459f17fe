"""`python -m mlrb`: Hydra composes the run; this module reads the command line and checks it first.

Hydra's flags (-m, --cfg, --help...) may come before or after the overrides: they are
parsed here and handed to Hydra first, as its own parser requires.

Hydra's own errors for a bad choice or key are multi-line and end with a stack
trace hint. A bad value is instead reported in one line naming it and what would
be valid, with exit status 2 and before anything runs or is recorded:

- a sweep (and --cfg): every job of the command (each combination) is composed and
  validated here before the command line goes to Hydra;
- a single run: the config Hydra composes for the run is validated by a Hydra
  callback (`ConfigCheck`) before the run's folder is made, so it is composed once
  (twice would cost a noticeable part of a short run). Hydra's own report of a config
  it cannot compose is held back; in its place, the same check as for a sweep names
  the bad value.
"""

from __future__ import annotations

import argparse
import difflib
import io
import itertools
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from mlrb.config import CONF_DIR, ConfigError, MlrbConfig, register_schema, to_typed

GROUPS = ("task", "agent", "budget", "sandbox", "launcher", "tracking")

# Hydra's command-line flags: (long, short, takes, help). `takes` is None for a switch,
# a list of choices, "value" for free text, or ("optional", choices, default) for --info.
# Hydra's own parser takes flags only before the overrides; mlrb parses them anywhere
# and hands Hydra the same command with the flags first.
INFO_CHOICES = ["all", "config", "defaults", "defaults-tree", "plugins", "searchpath"]
FLAGS = (
    ("--help", "-h", None, "this help: config groups and their choices"),
    ("--hydra-help", None, None, "Hydra's own help"),
    ("--cfg", "-c", ["job", "hydra", "all"], "print the config instead of running"),
    ("--resolve", None, None, "with --cfg: resolve interpolations before printing"),
    ("--package", "-p", "value", "with --cfg: the config package to print"),
    ("--run", "-r", None, "run one job (the default)"),
    ("--multirun", "-m", None, "a sweep: one job per combination of comma-separated values"),
    ("--shell-completion", "-sc", None, "install or uninstall shell completion"),
    ("--config-path", "-cp", "value", "the primary config folder instead of mlrb's"),
    ("--config-name", "-cn", "value", "the primary config's name (default: config)"),
    ("--config-dir", "-cd", "value", "a folder of your own configs: its files add choices to mlrb's groups"),
    ("--experimental-rerun", None, "value", "rerun a job from its config pickle"),
    ("--info", "-i", ("optional", INFO_CHOICES, "all"), "print Hydra's information"),
)

log = logging.getLogger("mlrb")


class CommandLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse prints usage and exits; mlrb's rule is one line
        raise ConfigError(message)


def parse_command_line(argv: list[str]) -> argparse.Namespace:
    """Hydra's flags and the overrides, in any order."""
    import hydra

    parser = CommandLineParser(prog="python -m mlrb", add_help=False)
    parser.add_argument("--version", action="version", version=f"mlrb {version()} (Hydra {hydra.__version__})")
    parser.add_argument("overrides", nargs="*")
    for long, short, takes, text in FLAGS:
        names = [long] + ([short] if short else [])
        if takes is None:
            parser.add_argument(*names, action="store_true", help=text)
        elif takes == "value":
            parser.add_argument(*names, help=text)
        elif isinstance(takes, tuple):
            parser.add_argument(*names, nargs="?", choices=takes[1], const=takes[2], help=text)
        else:
            parser.add_argument(*names, choices=takes, help=text)
    # `--info` takes an optional choice: one not followed by a choice means `--info all`,
    # so that an override after it is not taken for its value
    argv = [
        "--info=all" if arg in ("--info", "-i") and (i + 1 == len(argv) or argv[i + 1] not in INFO_CHOICES) else arg
        for i, arg in enumerate(argv)
    ]
    return parser.parse_intermixed_args(argv)


def hydra_command_line(args: argparse.Namespace) -> list[str]:
    """The same command as Hydra's parser takes it: every flag before the overrides."""
    flags: list[str] = []
    for long, _, _takes, _ in FLAGS:
        value = getattr(args, long.lstrip("-").replace("-", "_"))
        if value is True:
            flags.append(long)
        elif value not in (None, False):
            flags += [long, value]
    return flags + list(args.overrides)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version("mlrb")
    except PackageNotFoundError:
        return "unknown"


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """Every job of a sweep: the product of the comma-separated values (as Hydra's basic sweeper)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = []
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.get_key_element()
        if override.is_discrete_sweep():
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        elif override.is_sweep_override():
            raise ConfigError(
                f"'{override.input_line}': interval sweeps need an optimizing sweeper; "
                "use comma-separated values, choice() or range()"
            )
        else:
            choices.append([f"{key}={override.get_value_element_as_str()}"])
    return [list(job) for job in itertools.product(*choices)]


def precheck(args: argparse.Namespace) -> None:
    """Compose and validate every job the command line asks for; raise ConfigError on the first bad one."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    if args.config_dir and not Path(args.config_dir).is_dir():
        raise ConfigError(f"--config-dir {args.config_dir}: no such folder")
    extra = [f"hydra.searchpath=[file://{Path(args.config_dir).resolve()}]"] if args.config_dir else []
    overrides = [o for o in args.overrides if not o.lstrip("+~").startswith("hydra")]
    try:
        jobs = sweep_jobs(overrides) if args.multirun else [overrides]
    except HydraException as e:
        raise ConfigError(f"cannot parse the command line: {str(e).splitlines()[0]}") from None

    config_dir = Path(args.config_path).resolve() if args.config_path else CONF_DIR
    config_name = args.config_name or "config"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name="mlrb"):
            loader = GlobalHydra.instance().config_loader()

            def group_options(group: str) -> list[str]:  # the search path includes --config-dir
                return loader.get_group_options(group, config_name=config_name, overrides=extra)

            for job in jobs:
                for override in job:
                    check_group_choice(override, group_options)
                try:
                    cfg = compose(config_name=config_name, overrides=job + extra)
                except Exception as e:  # Hydra and OmegaConf raise many types; all are config errors here
                    raise ConfigError(explain_compose_error(job, e, extra)) from None
                if not args.cfg:  # printing a config may show values still to fill in (???)
                    to_typed(cfg)
    finally:
        GlobalHydra.instance().clear()


def check_group_choice(override: str, group_options: Callable[[str], list[str]]) -> None:
    key, _, value = override.lstrip("+~").partition("=")
    if key not in GROUPS:
        return
    options = group_options(key)
    if value not in options:
        raise ConfigError(f"unknown {key} '{value}'; valid choices: {', '.join(options)}")


def explain_compose_error(job: list[str], error: Exception, extra: list[str]) -> str:
    text = str(error)
    for override in job:
        key = override.lstrip("+~").partition("=")[0]
        if f"'{key}'" in text and ("not in struct" in text or "Could not override" in text):
            return unknown_key_message(key, [o for o in job if o.lstrip("+~").partition("=")[0] in GROUPS] + extra)
    cause = error.__cause__
    if cause is not None and str(cause):
        culprit = next((o for o in job if o in text), None)
        lead = f"invalid override '{culprit}': " if culprit else ""
        return lead + str(cause).splitlines()[0]
    return text.splitlines()[0] if text else type(error).__name__


def unknown_key_message(key: str, choices: list[str] | None = None) -> str:
    """Name the misspelt key and the keys that exist where it was looked for (with the
    command line's group choices, e.g. the chosen agent's options)."""
    from hydra import compose

    base = compose(config_name="config", overrides=choices or [])
    node: object = base
    parts = key.split(".")
    where: list[str] = []
    for part in parts[:-1]:
        if isinstance(node, DictConfig) and part in node:
            node, where = node[part], where + [part]
        else:
            break
    valid = sorted(str(k) for k in node.keys()) if isinstance(node, DictConfig) else []
    missing = parts[len(where)]
    prefix = ".".join(where) + "." if where else ""
    close = difflib.get_close_matches(missing, valid, n=1)
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
    scope = f"under '{'.'.join(where)}'" if where else "at the top level"
    return f"unknown config key '{key}'{hint} Valid keys {scope}: {', '.join(valid)}"


class SingleRunCheck:
    """A single run's config, validated once Hydra has composed it and before the run's folder
    is made; Hydra's console output is held back until then (see the module's docstring)."""

    CALLBACK = "+hydra.callbacks.mlrb_config_check._target_=mlrb.cli.ConfigCheck"
    active: SingleRunCheck | None = None

    def __init__(self) -> None:
        self.typed: MlrbConfig | None = None
        self.composed = False
        self.held = io.StringIO()
        self.stderr: Any = None

    def __enter__(self) -> SingleRunCheck:
        SingleRunCheck.active = self
        self.stderr, sys.stderr = sys.stderr, self.held
        return self

    @property
    def holding(self) -> bool:
        return self.stderr is not None

    def release(self) -> None:
        """Hydra composed the config: its output goes to the console again."""
        if self.holding:
            sys.stderr, self.stderr = self.stderr, None
            sys.stderr.write(self.held.getvalue())

    def __exit__(self, *exc: Any) -> None:
        SingleRunCheck.active = None
        if self.holding:  # Hydra stopped before composing the config: what it said is kept in `held`
            sys.stderr, self.stderr = self.stderr, None


class ConfigCheck(Callback):
    """Hydra calls this with the composed config, before it makes the run's folder."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        check = SingleRunCheck.active
        if check is None:
            return
        check.composed = True
        check.release()
        try:
            check.typed = to_typed(config)
        except ConfigError as e:
            print(f"mlrb: error: {e}", file=sys.stderr)
            sys.exit(2)


def job(cfg: DictConfig) -> dict | None:
    """What Hydra runs for each job."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from mlrb import console, run

    hydra_cfg = HydraConfig.get()
    checked = SingleRunCheck.active.typed if SingleRunCheck.active else None
    try:
        typed = checked or to_typed(cfg)
        with console.quiet(typed.verbose):
            result = run.execute(typed, Path(hydra_cfg.runtime.output_dir))
    except ConfigError as e:
        print(f"mlrb: error: {e}", file=sys.stderr)
        sys.exit(2)
    except run.RunFailed as e:
        if hydra_cfg.mode == RunMode.MULTIRUN:
            return {"run_id": e.run_id, "status": run.Status.INFRA_ERROR.value, "error": str(e)}  # the sweep goes on
        where = f"; the traceback is in {e.log_file}" if e.log_file else ""
        print(f"mlrb: run failed ({e.run_id}): {e}{where}", file=sys.stderr)
        sys.exit(1)
    except run.RunInterrupted as e:  # recorded as killed; one line, no traceback
        print(f"mlrb: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # before the run was created: nothing recorded
        print("mlrb: interrupted before the run started; nothing was recorded", file=sys.stderr)
        sys.exit(130)
    score = "no score" if result.score is None else f"score {result.score:.4f}"
    validity = "valid" if result.valid else f"invalid: {result.reason}"
    print(f"{result.name}: {score} ({validity}); status {result.status}; mlflow run {result.run_id}")
    if result.store_error:
        print(
            f"{result.name}: not yet in the tracking store, which could not be reached ({result.store_error}); "
            f"its record is complete in {result.run_dir}: `python -m mlrb.sync {result.run_dir}` uploads it"
        )
    return dict(vars(result))


def end_process(code: Any) -> NoReturn:
    """End `python -m mlrb` once a single run is over, without the interpreter's teardown
    (freeing every module and object: a second or more per run, more on a busy machine).
    By then the run has written everything to the store (its traces were flushed when its
    agent ended, mlrb/agents/tracing.py) and reaped its processes; what is left is written
    here: the log file, standard output and error. While a thread that is not a daemon
    still runs (a library's uploads, say), the process exits as usual, which waits for it."""
    from mlrb import recording_process

    recording_process.stop()  # every write was answered: the recording process ends
    if not (code is None or isinstance(code, int)):
        sys.exit(code)  # a message: Python prints it and exits with 1
    code = code or 0
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    logging.shutdown()  # flushes and closes every handler: the run's log file
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None, end_at_once: bool = False) -> None:
    """The command line. `end_at_once` (python -m mlrb): a single run's process ends
    through `end_process` once its config was composed, whatever its exit status."""
    import hydra

    argv = list(sys.argv[1:] if argv is None else argv)
    # MLflow reports usage to an outside host unless told not to: off unless the user set it.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    register_schema()
    try:
        args = parse_command_line(argv)
        single_run = not (args.multirun or args.cfg or args.help or args.hydra_help or args.info
                          or args.shell_completion or args.experimental_rerun)  # fmt: skip
        if single_run and args.config_dir and not Path(args.config_dir).is_dir():
            raise ConfigError(f"--config-dir {args.config_dir}: no such folder")
        if not single_run and not (
            args.help or args.hydra_help or args.info or args.shell_completion
        ):  # these run nothing
            precheck(args)  # a sweep, --cfg: every job, before Hydra starts
    except ConfigError as e:
        print(f"mlrb: error: {e}", file=sys.stderr)
        sys.exit(2)
    if single_run and end_at_once:
        # MLflow's imports start now, in a process of their own, while Hydra composes the config.
        from mlrb import recording_process

        recording_process.start()
    sys.argv = [sys.argv[0]] + hydra_command_line(args)  # hydra.main reads sys.argv
    app = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(job)
    if not single_run:
        return app()
    sys.argv.append(SingleRunCheck.CALLBACK)
    check = SingleRunCheck()
    try:
        with check:
            app()
    except SystemExit as e:
        if check.composed or e.code in (0, None):
            if end_at_once and check.composed:
                end_process(e.code)
            raise  # the run ended, or its config was refused in one line already
        hydra_stopped = e
    else:
        if end_at_once and check.composed:
            end_process(0)
        return
    try:  # Hydra could not compose the config: name the bad value in one line
        precheck(args)
    except ConfigError as e:
        print(f"mlrb: error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.stderr.write(check.held.getvalue())  # not a value mlrb checks: Hydra's own report
    raise hydra_stopped


def command() -> None:
    """The installed `mlrb` script: the same as `python -m mlrb`, its fast end included."""
    main(end_at_once=True)
