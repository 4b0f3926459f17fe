"""`python -m mlrb.prefetch task=<name> task.scale=full`: fill the user's Hugging Face cache
with every model, dataset and evaluation set a full-scale run of the task needs.

Without `task=`, every task. Online (HF_HUB_OFFLINE unset), what is missing is downloaded
with the libraries' progress bars (from HF_ENDPOINT, the Hub by default); an item that fails
is one line naming it and why, the others are still fetched, and a Hub that cannot be
reached is one line before anything is tried. Offline (HF_HUB_OFFLINE=1, a compute node),
or with `--check`, nothing is fetched: each missing item is one line, and the exit status
is 1 when anything is missing. A full-scale run checks the same list before it starts
(`refuse_if_missing`) and refuses, naming what is missing.

A task with Python requirements of its own (mlrb/harness/environments.py) also gets its environment
built into the cache (`paths.cache_dir`), from the package index pip is configured with
(whatever HF_HUB_OFFLINE says); with `--check`, only whether it is there.

`agent=NAME` (say `agent=claude_code`) installs that agent's pinned program into the cache
instead (mlrb/agents/installed.py, with npm), for compute nodes without the npm registry;
with `--check`, only says whether it is there. No API key is needed for it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mlrb.core.config import ConfigError
from mlrb.task_kit.hub import HubItem, download, is_present
from mlrb.tasks.handling import hub_needs

USAGE = (
    "usage: python -m mlrb.prefetch [--check] [task=NAME[,NAME...]] [task.scale=full] [other config overrides]"
    " | [--check] agent=NAME"
)


def missing_items(task: Any) -> list[HubItem]:
    return [item for item in hub_needs(task) if not is_present(item)]


def refuse_if_missing(task: Any) -> None:
    """Raise ConfigError (one line, before anything is recorded) if the user's Hugging Face
    cache lacks anything the task at its scale needs."""
    missing = missing_items(task)
    if not missing:
        return
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    raise ConfigError(
        f"{task.name} at {task.scale} scale needs what is not in the Hugging Face cache ({cache_location()}): "
        f"{'; '.join(item.describe() for item in missing[:3])}{more}. Run `python -m mlrb.prefetch "
        f"task={task.name} task.scale={task.scale}` on a machine with internet (same HF_HOME), then run again"
    )


def cache_location() -> str:
    from huggingface_hub import constants

    return constants.HF_HOME


def tasks_for(overrides: list[str]) -> list[Any]:
    """The tasks the command line names (`task=a,b`; all of them without `task=`), configured by
    its overrides. A task that cannot be configured is a string saying why."""
    return [task for task, _ in configured_tasks(overrides)]


def configured_tasks(overrides: list[str]) -> list[tuple[Any, Path]]:
    """tasks_for's tasks, each with the cache folder its config names (paths.cache_dir)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mlrb.core import registry
    from mlrb.core.config import CONF_DIR, register_schema, to_typed

    register_schema()
    named = [n for o in overrides if o.startswith("task=") for n in o.split("=", 1)[1].split(",")]
    known = sorted(registry.task_folders())
    names = named or known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"unknown task '{unknown[0]}'; valid choices: {', '.join(known)}")
    rest = [o for o in overrides if not o.startswith("task=")]
    tasks: list[tuple[Any, Path]] = []
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="mlrb_prefetch"):
            for name in names:
                try:
                    cfg = to_typed(compose(config_name="config", overrides=[f"task={name}", *rest]))
                    tasks.append((registry.load_task(cfg.task), Path(cfg.paths.cache_dir)))
                except Exception as e:  # Hydra and OmegaConf raise many types; all are config errors here
                    if named and len(names) == 1:
                        raise ConfigError(str(e).splitlines()[0]) from None
                    tasks.append((f"{name}: cannot be configured: {str(e).splitlines()[0]}", Path()))
    finally:
        GlobalHydra.instance().clear()
    return tasks


def prefetch_environment(task: Any, cache_dir: Path, check_only: bool) -> int:
    """Build the task's own Python environment (mlrb/harness/environments.py) into the cache, or with
    `check_only` say whether it is there; how many are missing (0 or 1). Building needs the
    package index, not the Hub, so HF_HUB_OFFLINE does not stop it."""
    from mlrb.harness import environments

    requirements = list(task.requirements)
    if not requirements:
        return 0
    where = environments.location(requirements, cache_dir)
    if not environments.is_built(where) and not check_only:
        print(f"{task.name}: building its Python environment ({', '.join(requirements)})", flush=True)
        try:
            environments.ensure(task.name, requirements, cache_dir)
        except ConfigError as e:
            print(f"mlrb.prefetch: error: {e}", file=sys.stderr, flush=True)
    if not environments.is_built(where):
        print(f"missing: {task.name}: its Python environment ({', '.join(requirements)}) in {where}")
        return 1
    print(f"{task.name}: its Python environment is built ({where})", flush=True)
    return 0


def prefetch_agent(overrides: list[str], check_only: bool) -> int:
    """Install the program `agent=NAME` runs (its `agent.options.install`) into the cache, or with
    `check_only` say whether it is there; the exit status (0: there, 1: missing, 2: refused)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from mlrb.agents import installed
    from mlrb.core.config import CONF_DIR, register_schema

    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="mlrb_prefetch"):
            # Not checked whole: the agent's check asks for its API key, which installing does not need.
            cfg = compose(config_name="config", overrides=overrides)
            options = OmegaConf.to_container(cfg.agent.get("options") or OmegaConf.create({}), resolve=True)
            install = options.get("install") if isinstance(options, dict) else None
            name, cache_dir = str(cfg.agent.name), Path(str(cfg.paths.cache_dir))
    except Exception as e:  # Hydra and OmegaConf raise many types; all are config errors here
        print(f"mlrb.prefetch: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    finally:
        GlobalHydra.instance().clear()
    if not install:
        print(f"{name}: nothing to install (it runs in the harness, or a program you give it)")
        return 0
    spec, bins = str(install["npm"]), {str(k): str(v) for k, v in dict(install["bin"]).items()}
    root = installed.location(cache_dir, spec)
    if not installed.is_installed(root, bins) and not check_only:
        print(f"{name}: installing {spec} with npm", flush=True)
        try:
            installed.ensure(name, spec, bins, cache_dir)
        except ConfigError as e:
            print(f"mlrb.prefetch: error: {e}", file=sys.stderr)
    if not installed.is_installed(root, bins):
        print(f"missing: {name}: {spec} in {root}")
        return 1
    print(f"{name}: {spec} is installed ({root})")
    return 0


def one_line(error: BaseException) -> str:
    """Why a download failed, in one line: the Hub's HTTP answer where one is behind the error
    (the libraries wrap it in errors of several lines), else the error's type and first line."""
    cause: BaseException | None = error
    for _ in range(8):  # the chain of causes is short; a bound keeps a cyclic one finite
        if cause is None:
            break
        response = getattr(cause, "response", None)
        if response is not None and getattr(response, "status_code", None):
            says = response.headers.get("X-Error-Message")
            answer = f"{response.status_code} {response.reason_phrase}" + (f" ({says})" if says else "")
            url = str(response.request.url).split("?")[0]  # a CDN's signed query is no one's business
            return f"the Hub answered {answer} to {response.request.method} {url}"
        cause = cause.__cause__ or cause.__context__
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first}"


def hub_unreachable() -> str | None:
    """None if the Hub (HF_ENDPOINT) answers at all, with any status; else why not, in one line.
    Asked once before the first download: without it, an unreachable Hub (a compute node that
    forgot HF_HUB_OFFLINE=1) costs every dataset item the libraries' retries, ~20 s each."""
    from huggingface_hub import constants, get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except Exception as e:  # refused, no DNS, timeout, proxy, TLS: the transport's errors have no common type here
        return one_line(e)
    return None


def help_text() -> str:
    """What --help prints (the docs' commands page shows it too)."""
    return USAGE + "\n" + (__doc__ or "")


def main(argv: list[str] | None = None) -> int:
    from huggingface_hub import constants

    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(help_text())
        return 0
    check_only = "--check" in args or constants.HF_HUB_OFFLINE
    overrides = [a for a in args if a != "--check"]
    try:
        bad = next((a for a in overrides if "=" not in a), None)
        if bad:
            raise ConfigError(f"'{bad}' is not a config override (key=value); {USAGE}")
        if any(o.startswith("agent=") for o in overrides) and not any(o.startswith("task=") for o in overrides):
            return prefetch_agent(overrides, check_only="--check" in args)
        tasks = configured_tasks(overrides)
    except ConfigError as e:
        print(f"mlrb.prefetch: error: {e}", file=sys.stderr)
        return 2
    missing_total = 0
    unreachable: str | None = None  # asked before the first download: why the Hub cannot be reached ("": it answers)
    for task, cache_dir in tasks:
        if isinstance(task, str):
            print(f"missing: {task}")
            missing_total += 1
            continue
        missing_total += prefetch_environment(task, cache_dir, check_only="--check" in args)
        needs = hub_needs(task)
        if not needs:
            print(f"{task.name} ({task.scale}): nothing to fetch (its assets are built locally)")
            continue
        missing = [item for item in needs if not is_present(item)]
        if missing and not check_only and unreachable is None:
            unreachable = hub_unreachable() or ""
            if unreachable:
                print(
                    f"mlrb.prefetch: error: cannot reach the Hugging Face Hub at {constants.ENDPOINT} ({unreachable});"
                    " nothing fetched. Without internet, HF_HUB_OFFLINE=1 checks the cache only",
                    file=sys.stderr,
                )
        if missing and not check_only and not unreachable:
            for n, item in enumerate(missing, 1):
                print(f"{task.name}: fetching {item.describe()} ({n}/{len(missing)})", flush=True)
                try:
                    download(item)
                except Exception as e:  # whatever stops one item (HTTP, network, disk): one line, go on
                    print(
                        f"mlrb.prefetch: error: {task.name}: cannot fetch {item.describe()}: {one_line(e)}",
                        file=sys.stderr,
                        flush=True,
                    )
            missing = [item for item in needs if not is_present(item)]
        for item in missing:
            print(f"missing: {task.name}: {item.describe()}")
        missing_total += len(missing)
        state = "complete" if not missing else f"{len(missing)} of {len(needs)} missing"
        print(f"{task.name} ({task.scale}): {state} ({len(needs)} items in {cache_location()})", flush=True)
    if missing_total:
        offline = check_only or unreachable
        how = "run this again on a machine with internet (HF_HUB_OFFLINE unset)" if offline else "see above"
        print(f"mlrb.prefetch: {missing_total} item(s) missing; {how}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
