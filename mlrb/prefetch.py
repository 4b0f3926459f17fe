"""`python -m mlrb.prefetch task=<name> task.scale=full`: fill the user's Hugging Face cache
with every model, dataset and evaluation set a full-scale run of the task needs.

Without `task=`, every task. Online (HF_HUB_OFFLINE unset), what is missing is downloaded
with the libraries' progress bars; offline (HF_HUB_OFFLINE=1, a compute node), or with
`--check`, nothing is fetched: each missing item is one line, and the exit status is 1
when anything is missing. A full-scale run checks the same list before it starts
(`refuse_if_missing`) and refuses, naming what is missing.
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional

from mlrb.config import ConfigError
from mlrb.tasks.hub import HubItem, download, is_present, task_needs

USAGE = "usage: python -m mlrb.prefetch [--check] [task=NAME[,NAME...]] [task.scale=full] [other config overrides]"


def missing_items(task: Any) -> List[HubItem]:
    return [item for item in task_needs(task) if not is_present(item)]


def refuse_if_missing(task: Any) -> None:
    """Raise ConfigError (one line, before anything is recorded) if the user's Hugging Face
    cache lacks anything the task at its scale needs."""
    missing = missing_items(task)
    if not missing:
        return
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    raise ConfigError(
        f"{task.name} at {task.cfg.scale} scale needs what is not in the Hugging Face cache ({cache_location()}): "
        f"{'; '.join(item.describe() for item in missing[:3])}{more}. Run `python -m mlrb.prefetch "
        f"task={task.name} task.scale={task.cfg.scale}` on a machine with internet (same HF_HOME), then run again"
    )


def cache_location() -> str:
    from huggingface_hub import constants

    return constants.HF_HOME


def tasks_for(overrides: List[str]) -> List[Any]:
    """The tasks the command line names (`task=a,b`; all of them without `task=`), configured by
    its overrides. A task that cannot be configured is a string saying why."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mlrb import registry
    from mlrb.config import CONF_DIR, register_schema, to_typed

    register_schema()
    named = [n for o in overrides if o.startswith("task=") for n in o.split("=", 1)[1].split(",")]
    names = named or sorted(registry.TASKS)
    unknown = [n for n in names if n not in registry.TASKS]
    if unknown:
        raise ConfigError(f"unknown task '{unknown[0]}'; valid choices: {', '.join(sorted(registry.TASKS))}")
    rest = [o for o in overrides if not o.startswith("task=")]
    tasks = []
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="mlrb_prefetch"):
            for name in names:
                try:
                    cfg = to_typed(compose(config_name="config", overrides=[f"task={name}", *rest]))
                    tasks.append(registry.load(registry.TASKS[name])(cfg.task))
                except Exception as e:  # Hydra and OmegaConf raise many types; all are config errors here
                    if named and len(names) == 1:
                        raise ConfigError(str(e).splitlines()[0]) from None
                    tasks.append(f"{name}: cannot be configured: {str(e).splitlines()[0]}")
    finally:
        GlobalHydra.instance().clear()
    return tasks


def main(argv: Optional[List[str]] = None) -> int:
    from huggingface_hub import constants

    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(USAGE + "\n" + (__doc__ or ""))
        return 0
    check_only = "--check" in args or constants.HF_HUB_OFFLINE
    overrides = [a for a in args if a != "--check"]
    try:
        bad = next((a for a in overrides if "=" not in a), None)
        if bad:
            raise ConfigError(f"'{bad}' is not a config override (key=value); {USAGE}")
        tasks = tasks_for(overrides)
    except ConfigError as e:
        print(f"mlrb.prefetch: error: {e}", file=sys.stderr)
        return 2
    missing_total = 0
    for task in tasks:
        if isinstance(task, str):
            print(f"missing: {task}")
            missing_total += 1
            continue
        needs = task_needs(task)
        if not needs:
            print(f"{task.name} ({task.cfg.scale}): nothing to fetch (its assets are built locally)")
            continue
        missing = [item for item in needs if not is_present(item)]
        if missing and not check_only:
            for n, item in enumerate(missing, 1):
                print(f"{task.name}: fetching {item.describe()} ({n}/{len(missing)})", flush=True)
                download(item)
            missing = [item for item in needs if not is_present(item)]
        for item in missing:
            print(f"missing: {task.name}: {item.describe()}")
        missing_total += len(missing)
        state = "complete" if not missing else f"{len(missing)} of {len(needs)} missing"
        print(f"{task.name} ({task.cfg.scale}): {state} ({len(needs)} items in {cache_location()})", flush=True)
    if missing_total:
        how = "run this again on a machine with internet (HF_HUB_OFFLINE unset)" if check_only else "see above"
        print(f"mlrb.prefetch: {missing_total} item(s) missing; {how}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
