"""A multi-step Harbor task: task.toml's `[[steps]]`, run in order in one environment, each step
with its own instruction (`steps/<name>/instruction.md`), its own verifier (`steps/<name>/tests/`
laid over the task's `tests/`, its test.sh the step's own, else the task's) and its own solution
(`steps/<name>/solution/solve.sh`, which agent=baseline runs in that step). A step's reward under
its `min_reward` (a number, for the reward; or a table of reward keys) ends the run there, as
Harbor ends the trial. The run's reward is Harbor's trial reward: `multi_step_reward_strategy`
"mean" (Harbor's default: the mean over the steps verified) or "final" (the last step verified)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from mlrb.core.config import ConfigError

STEPS_DIR = "steps"
STRATEGIES = ("mean", "final")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# A step's own settings mlrb has no counterpart for: refused in one line naming the key.
UNSUPPORTED = {
    ("agent", "user"): "a step's own agent user",
    ("verifier", "user"): "a verifier user of its own",
    ("verifier", "environment"): "a separate verifier environment",
    ("verifier", "environment_mode"): "a separate verifier environment",
    ("", "healthcheck"): "a step's healthcheck",
    ("", "artifacts"): "a step's artifacts",
}


@dataclass(frozen=True)
class Step:
    name: str
    min_reward: dict[str, float] = field(default_factory=dict)  # reward key -> the least that goes on
    agent_timeout_s: float | None = None  # [steps.agent] timeout_sec (None: the task's [agent] one)
    verifier_timeout_s: float | None = None  # [steps.verifier] timeout_sec (None: the task's)
    verifier_env: dict[str, str] = field(default_factory=dict)  # [steps.verifier] env, over the task's


def read(data: dict, file: Path, environment_of) -> tuple[tuple[Step, ...], str]:
    """task.toml's steps and its reward strategy (both empty for a task of one step); a ConfigError
    naming the bad value. ENVIRONMENT_OF(table, where) reads a table's env as the task's are read."""
    raw = data.get("steps")
    strategy = data.get("multi_step_reward_strategy")
    if raw in (None, []):
        return (), ""
    if not isinstance(raw, list) or not all(isinstance(step, dict) for step in raw):
        raise ConfigError(f"{file}: steps must be [[steps]] tables")
    if strategy is not None and strategy not in STRATEGIES:
        raise ConfigError(f"{file}: multi_step_reward_strategy = {strategy!r}; valid: {', '.join(STRATEGIES)}")
    steps, seen = [], set()
    for index, table in enumerate(raw, 1):
        name = table.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name) or name in seen:
            raise ConfigError(
                f"{file}: step {index}'s name = {name!r}; give each step a name of its own (letters, "
                "digits, '.', '_' or '-'), its folder under steps/"
            )
        seen.add(name)
        for (where, key), what in UNSUPPORTED.items():
            values = table.get(where, {}) if where else table
            if isinstance(values, dict) and values.get(key) not in (None, [], {}, ""):
                named = f"[steps.{where}] {key}" if where else f"[[steps]] {key}"
                raise ConfigError(f"{file}: step {name}: {named} ({what}) is not supported by mlrb's Harbor route")
        agent, verifier = (sub_table(table, key, file, name) for key in ("agent", "verifier"))
        steps.append(
            Step(
                name=name,
                min_reward=min_reward(table.get("min_reward"), file, name),
                agent_timeout_s=seconds(agent, file, name, "agent"),
                verifier_timeout_s=seconds(verifier, file, name, "verifier"),
                verifier_env=environment_of(verifier, "steps.verifier"),
            )
        )
    return tuple(steps), str(strategy or "mean")


def check_folder(folder: Path, steps: tuple[Step, ...]) -> None:
    """Each step's folder has its instruction and a test.sh (its own, or the task's); a ConfigError naming
    the first thing missing, or what of a step mlrb does not run (its workdir/ setup)."""
    for step in steps:
        own = folder / STEPS_DIR / step.name
        if not (own / "instruction.md").is_file():
            raise ConfigError(
                f"Harbor task folder {folder}: step {step.name} has no {STEPS_DIR}/{step.name}/instruction.md"
            )
        if not (own / "tests" / "test.sh").is_file() and not (folder / "tests" / "test.sh").is_file():
            raise ConfigError(
                f"Harbor task folder {folder}: step {step.name} has no test.sh (in {STEPS_DIR}/"
                f"{step.name}/tests/ or tests/)"
            )
        if (own / "workdir").exists():
            raise ConfigError(
                f"Harbor task folder {folder}: {STEPS_DIR}/{step.name}/workdir/ (a step's files and "
                "setup.sh) is not supported by mlrb's Harbor route"
            )


def sub_table(table: dict, key: str, file: Path, name: str) -> dict:
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{file}: step {name}: [steps.{key}] must be a table, not {value!r}")
    return value


def seconds(values: dict, file: Path, name: str, where: str) -> float | None:
    value = values.get("timeout_sec")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{file}: step {name}: [steps.{where}] timeout_sec = {value!r}; it must be a positive number")
    return float(value)


def min_reward(value: object, file: Path, name: str) -> dict[str, float]:
    """`min_reward`: a number (for the reward) or a table of reward keys; {} for none."""
    if value is None:
        return {}
    values = value if isinstance(value, dict) else {"reward": value}
    found: dict[str, float] = {}
    for key, threshold in values.items():
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold):
            raise ConfigError(f"{file}: step {name}: min_reward {key} = {threshold!r}; it must be a number")
        found[str(key)] = float(threshold)
    return found
