"""A Harbor task's own settings beyond its limits, as far as mlrb follows them: `[verifier] env`
(test.sh's environment), `[solution] env` (solve.sh's), `[agent] user` (the agent's user in the
task's container) and the network (`network_mode`, the older `allow_internet`), which mlrb's
policy keeps off unless the run's command line lets the agent out (`task.network=true`), and never
gives a verifier. What mlrb cannot follow is refused in one line that names the key."""

from __future__ import annotations

import re
from pathlib import Path

from mlrb.core.config import ConfigError

# Variables mlrb sets for the verifier to keep the agent's files from acting for it
# (verifier.trusted_python): a task's [verifier] env may not replace them.
VERIFIER_OWN = ("HOME", "PYTHONPATH", "PYTHONNOUSERSITE", "MLRB_VERIFIER_COPY", "MLRB_PYTEST_REPORTS")
NETWORK_MODES = ("no-network", "public", "allowlist")
# Settings mlrb has no counterpart for: (table, key) -> what it is. A task that sets them is refused.
UNSUPPORTED = {
    ("environment", "docker_image"): "a prebuilt image (mlrb builds environment/Dockerfile)",
    ("environment", "mcp_servers"): "MCP servers",
    ("environment", "healthcheck"): "a healthcheck",
    ("environment", "env"): "the container's environment",
    ("environment", "tpu"): "TPUs",
    ("environment", "skills_dir"): "skills",
    ("verifier", "environment"): "a separate verifier environment",
    ("verifier", "environment_mode"): "a separate verifier environment",
    ("verifier", "collect"): "collect commands",
    ("verifier", "user"): "a verifier user of its own",
    ("", "artifacts"): "artifacts",
}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def refuse_unsupported(data: dict, file: Path) -> None:
    """One ConfigError naming the first setting mlrb cannot follow."""
    for (where, key), what in UNSUPPORTED.items():
        values = data.get(where, {}) if where else data
        if isinstance(values, dict) and values.get(key) not in (None, [], {}, ""):
            named = f"[{where}] {key}" if where else key
            raise ConfigError(
                f"{file}: {named} ({what}) is not supported by mlrb's Harbor route; remove it to run "
                "the task without it"
            )
    if str(data.get("environment", {}).get("os", "linux")).lower() != "linux":
        raise ConfigError(f"{file}: [environment] os = {data['environment']['os']!r}; mlrb runs Linux tasks only")


def environment(values: dict, where: str, file: Path, reserved: tuple[str, ...] = ()) -> dict[str, str]:
    """`[WHERE] env`: names and literal values. A value that names a variable of this machine
    (`${VAR}`, which Harbor fills from its own environment) is refused: mlrb passes none of the
    harness's variables (its keys, its tokens) into a sandbox."""
    env = values.get("env", {})
    if not isinstance(env, dict):
        raise ConfigError(f'{file}: [{where}] env must be a table of NAME = "value", not {env!r}')
    for name, value in env.items():
        if not NAME.fullmatch(str(name)) or not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f'{file}: [{where}] env {name} = {value!r}; write NAME = "value"')
        if "${" in str(value):
            raise ConfigError(
                f"{file}: [{where}] env {name} = {value!r} names a variable of this machine, which "
                "mlrb does not pass into a sandbox; give its value"
            )
        if name in reserved or name.startswith("MLRB_"):
            raise ConfigError(
                f"{file}: [{where}] env {name}: mlrb sets it for the verifier (the names it keeps: "
                f"{', '.join(reserved)}, MLRB_*)"
            )
    return {str(name): str(value) for name, value in env.items()}


def agent_user(agent: dict, file: Path) -> str:
    """`[agent] user`: a user name or uid ("": none, Harbor's default, the image's own)."""
    user = agent.get("user")
    if user is None:
        return ""
    if isinstance(user, bool) or not isinstance(user, str | int) or not re.fullmatch(r"[A-Za-z0-9_.:-]+", str(user)):
        raise ConfigError(f"{file}: [agent] user = {user!r}; give a user name or a uid")
    return str(user)


def network_mode(data: dict, file: Path) -> str:
    """What the task asks of the agent's network: `[agent] network_mode`, else `[environment]`'s,
    else the older `allow_internet` ("": it says nothing; Harbor's default is public)."""
    for where in ("agent", "environment"):
        mode = data.get(where, {}).get("network_mode")
        if mode is not None:
            if mode not in NETWORK_MODES:
                raise ConfigError(f"{file}: [{where}] network_mode = {mode!r}; valid: {', '.join(NETWORK_MODES)}")
            return str(mode)
    allowed = data.get("environment", {}).get("allow_internet")
    if allowed is None:
        return ""
    if not isinstance(allowed, bool):
        raise ConfigError(f"{file}: [environment] allow_internet = {allowed!r}; it must be true or false")
    return "public" if allowed else "no-network"


def network_note(mode: str, network: bool, file: Path) -> str:
    """Whether the run's network (task.network) may follow the task's MODE: a ConfigError where it
    contradicts it, else what the run does unlike Harbor ("" for nothing)."""
    if mode == "no-network" and network:
        raise ConfigError(
            f"{file}: the task keeps its agent offline (network_mode = 'no-network'); task.network=true contradicts it"
        )
    if mode == "allowlist" and network:
        raise ConfigError(
            f"{file}: network_mode = 'allowlist' (allowed_hosts) cannot be enforced by mlrb; run "
            "it with task.network=false (offline)"
        )
    if mode in ("public", "allowlist") and not network:
        return (
            f"the task asks for the network (network_mode = '{mode}'): the agent runs offline unless task.network=true"
        )
    return ""
