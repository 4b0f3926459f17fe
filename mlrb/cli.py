"""`python -m mlrb`: Hydra composes and runs the jobs; this module reads the command line
and checks every job's config first.

The command line is read as Hydra's parser reads it, with one difference: Hydra's flags (-m,
--cfg, --help...) may come before or after the overrides, and are handed to `hydra.main`
first, as its parser requires. Hydra keeps that parser in a private module, so its flags are
declared here (HYDRA_FLAGS, names and what each takes) and tests/test_cli.py checks them
against Hydra's own: a Hydra upgrade that changes a flag fails a test, not a user's command.

One function checks the config of every command that runs a job or prints one, a single
run and a sweep alike (`check_jobs`): each job of the command (each combination of a
sweep) is composed and validated before the command line goes to Hydra. A bad value is
reported in one line naming it and what would be valid, with exit status 2 and before
anything runs or is recorded, where Hydra's own errors for a bad choice or key are
multi-line and end with a stack trace hint.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, cast

from omegaconf import DictConfig, OmegaConf

from mlrb.core.config import CONF_DIR, ConfigError, MlrbConfig, names_the_seed, register_schema, split_seed, to_typed

GROUPS = ("task", "agent", "budget", "sandbox", "launcher", "tracking")
SWITCH: dict[str, Any] = {"action": "store_true"}
VALUE: dict[str, Any] = {}
INFO = ("--info", "-i")  # Hydra's flag whose choice is optional: `--info` alone means `--info all`
HYDRA_FLAGS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--help", "-h"), SWITCH),
    (("--hydra-help",), SWITCH),
    (("--cfg", "-c"), {"choices": ["job", "hydra", "all"]}),
    (("--resolve",), SWITCH),
    (("--package", "-p"), VALUE),
    (("--run", "-r"), SWITCH),
    (("--multirun", "-m"), SWITCH),
    (("--shell-completion", "-sc"), SWITCH),
    (("--config-path", "-cp"), VALUE),
    (("--config-name", "-cn"), VALUE),
    (("--config-dir", "-cd"), VALUE),
    (("--experimental-rerun",), VALUE),
    (
        INFO,
        {
            "nargs": "?",
            "const": "all",
            "choices": ["all", "config", "defaults", "defaults-tree", "plugins", "searchpath"],
        },
    ),
)

log = logging.getLogger("mlrb")

# The configs check_jobs validated in this process, as composed (hydra's node left out) with
# their typed form: `job` takes the typed form from here when Hydra composes the same config
# again, instead of validating it twice (a single run's own process).
CHECKED: list[tuple[dict[str, Any], MlrbConfig]] = []


@dataclass(frozen=True)
class CommandLine:
    args: argparse.Namespace  # as Hydra's parser reads the command
    for_hydra: list[str]  # the same command, its flags first, as `hydra.main` reads sys.argv

    @property
    def runs_nothing(self) -> bool:
        """Help, information or shell completion: no job is composed."""
        a = self.args
        return bool(a.help or a.hydra_help or a.info or a.shell_completion)

    @property
    def single_run(self) -> bool:
        a = self.args
        return not (self.runs_nothing or a.multirun or a.cfg or a.experimental_rerun)


def is_override(token: str) -> bool:
    return "=" in token or token[:1] in ("~", "+")


class HydraFlagParser(argparse.ArgumentParser):
    """Hydra's flags and the overrides (HYDRA_FLAGS)."""

    def __init__(self) -> None:
        super().__init__(prog="python -m mlrb", add_help=False)
        self.add_argument("overrides", nargs="*")
        for names, takes in HYDRA_FLAGS:
            self.add_argument(*names, **takes)

    def error(self, message: str) -> NoReturn:  # argparse prints usage and exits; mlrb's rule is one line
        raise ConfigError(message)


def parse_command_line(argv: list[str]) -> CommandLine:
    """Hydra's flags and the overrides, in any order."""
    parser = HydraFlagParser()
    # `--info` followed by an override is `--info all`, not an --info choice named by the override
    argv = [
        "--info=all" if arg in INFO and (i + 1 == len(argv) or is_override(argv[i + 1])) else arg
        for i, arg in enumerate(argv)
    ]
    args = parser.parse_intermixed_args(argv)
    modes = [args.run, args.multirun, args.cfg is not None, args.info is not None, args.shell_completion]
    if sum(modes) > 1:  # Hydra raises a ValueError with a traceback
        raise ConfigError("give only one of --run, --multirun, --cfg, --info and --shell-completion")
    flags = list(argv)
    for override in args.overrides:  # what is left is the flags and their values, in their order
        flags.remove(override)
    return CommandLine(args, flags + list(args.overrides))


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
    from mlrb.tasks.harbor import dataset  # task.path=DIR/*: one job per Harbor task folder, as the launcher runs them

    return dataset.expand([list(job) for job in itertools.product(*choices)])


def check_jobs(args: argparse.Namespace) -> None:
    """Compose and validate every job the command line asks for, one for a single run and each
    combination of a sweep; raise ConfigError on the first bad one."""
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
    CHECKED.clear()  # a command's own checks only (main() may be called again in one process)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name="mlrb"):
            loader = GlobalHydra.instance().config_loader()

            def group_options(group: str) -> list[str]:  # the search path includes --config-dir
                return loader.get_group_options(group, config_name=config_name, overrides=extra)

            checked = set()  # a sweep's configurations checked: its jobs but for their seed
            for job in jobs:
                for override in job:
                    check_group_choice(override, group_options)
                rest, seed = split_seed(job)
                if args.multirun and seed is not None and rest in checked:
                    continue  # the same config with another seed, which no value of it names
                try:
                    cfg = compose(config_name=config_name, overrides=job + extra)
                except Exception as e:  # Hydra and OmegaConf raise many types; all are config errors here
                    raise ConfigError(explain_compose_error(job, e, extra)) from None
                if not args.cfg:  # printing a config may show values still to fill in (???)
                    typed = to_typed(cfg)
                    if not args.multirun:  # a sweep's jobs run in processes of their own
                        CHECKED.append((as_plain(cfg), typed))
                if seed is not None and not names_the_seed(cfg):
                    checked.add(rest)
    finally:
        GlobalHydra.instance().clear()


def as_plain(cfg: DictConfig) -> dict[str, Any]:
    """A composed config as plain data, unresolved, without Hydra's own node."""
    plain = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=False))
    return {key: value for key, value in plain.items() if key != "hydra"}


def checked(cfg: DictConfig) -> MlrbConfig:
    """The typed form of a job's config: the one check_jobs made where it checked this same
    config, else validated now (a sweep's job, or a job Hydra composed otherwise)."""
    plain = as_plain(cfg)
    for i, (seen, typed) in enumerate(CHECKED):
        if seen == plain:
            del CHECKED[i]  # used once: a run may change what it was given
            return typed
    return to_typed(cfg)


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


def help_text(config_dir: str | None = None) -> str:
    """What `python -m mlrb --help` prints: config.yaml's `hydra.help` template, its config groups
    the ones a user chooses from (the top-level groups but Hydra's own), each with its choices,
    those of `config_dir` (--config-dir) included. Hydra's own --help would also list the groups
    that only compose others (a part several tasks share: task/from_scratch)."""
    import string

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_schema()  # the task folders, as a search path Hydra reads the group `task` from
    extra = [f"hydra.searchpath=[file://{Path(config_dir).resolve()}]"] if config_dir else []
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="mlrb"):
            loader = GlobalHydra.instance().config_loader()
            groups = sorted(group for group in loader.list_groups("") if group != "hydra")
            lines = [
                f"{group}: {', '.join(sorted(loader.get_group_options(group, config_name='config', overrides=extra)))}"
                for group in groups
            ]
            template = str(compose(config_name="config", overrides=extra, return_hydra_config=True).hydra.help.template)
    finally:
        GlobalHydra.instance().clear()
    return string.Template(template).safe_substitute(APP_CONFIG_GROUPS="\n".join(lines) + "\n")


def job(cfg: DictConfig) -> dict | None:
    """What Hydra runs for each job."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from mlrb import run
    from mlrb.core import console

    hydra_cfg = HydraConfig.get()
    try:
        typed = checked(cfg)
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
    agent ended, mlrb/store/tracing.py) and reaped its processes; what is left is written
    here: the log file, standard output and error. While a thread that is not a daemon
    still runs (a library's uploads, say), the process exits as usual, which waits for it."""
    from mlrb.store import recording_process

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
    through `end_process` once its jobs' configs were checked, whatever its exit status."""
    import hydra

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--version" in argv:  # mlrb's, then Hydra's
        print(f"mlrb {version()} (Hydra {hydra.__version__})")
        sys.exit(0)
    # MLflow reports usage to an outside host unless told not to: off unless the user set it.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    register_schema()
    ends_at_once = False
    try:
        command = parse_command_line(argv)
        ends_at_once = end_at_once and command.single_run
        if ends_at_once:
            # MLflow's imports start now, in a process of their own, while the config is composed.
            from mlrb.store import recording_process

            recording_process.start()
        if not command.runs_nothing:
            check_jobs(command.args)
    except ConfigError as e:
        print(f"mlrb: error: {e}", file=sys.stderr)
        if ends_at_once:
            end_process(2)
        sys.exit(2)
    a = command.args
    if a.help and not (a.hydra_help or a.config_path or a.config_name):  # mlrb's help (Hydra's lists internal groups)
        print(help_text(a.config_dir))
        sys.exit(0)
    sys.argv = [sys.argv[0]] + command.for_hydra  # hydra.main reads sys.argv
    app = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(job)
    if not ends_at_once:
        return app()
    try:
        app()
    except SystemExit as e:
        end_process(e.code)
    end_process(0)


def command() -> None:
    """The installed `mlrb` script: the same as `python -m mlrb`, its fast end included."""
    main(end_at_once=True)
