"""Run the agent's commands as plain subprocesses of the harness: NO confinement.

The agent can read everything the harness's user can (the hidden evaluation data
included), reach the network and signal the harness's processes. Only the
environment is scrubbed (the allow-list of mlrb/sandbox/base.py) and each
command's process group is killed at its timeout and when the run ends. Chosen
only by name (`sandbox=unconfined`); such runs are tagged `mlrb.confined=false`
and the report never pools them with confined runs.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mlrb.core.config import SandboxConfig
from mlrb.models.endpoint import ModelEndpoint
from mlrb.sandbox.base import (
    ExecResult,
    GroupProcess,
    IsolatedCommand,
    IsolatedProcess,
    Limits,
    Sandbox,
    agent_environment,
    agents_own,
    capped,
    command_line,
    kill_group,
)


@dataclass
class UnconfinedOptions:
    pass


class UnconfinedSandbox(Sandbox):
    kind = "unconfined"
    confined = False
    options_class = UnconfinedOptions

    def __init__(
        self,
        cfg: SandboxConfig,
        workspace: Path,
        data_dir: Path,
        run_id: str,
        limits: Limits,
        seed: int = 0,
        task_environment: Path | None = None,
        model_endpoint: ModelEndpoint | None = None,
        agent_tools: Path | None = None,
        state_dir: Path | None = None,
        workspace_at: str = "",
    ):
        super().__init__(
            cfg,
            workspace,
            data_dir,
            run_id,
            limits,
            seed,
            task_environment,
            model_endpoint,
            agent_tools,
            state_dir,
            workspace_at,
        )
        self.workspace, self.data_dir = str(self.root), str(self.host_data_dir)
        self.model_url = model_endpoint.url if model_endpoint else None  # the host's loopback is its own
        self.env = agent_environment(
            self.workspace, self.data_dir, self.seed, task_environment, str(state_dir) if state_dir else None
        )
        self.running: set[int] = set()
        self.groups: list[int] = []  # every command's process group (its pid): what it left runs in it

    @classmethod
    def preflight(cls, cfg: SandboxConfig) -> None:
        cls.parse_options(cfg)

    def exec(self, command: str, timeout_s: float, whole_run: bool = False) -> ExecResult:
        timeout_s = timeout_s if whole_run else min(timeout_s, self.cfg.command_timeout_s)
        started = time.monotonic()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                ["/bin/bash", "-c", command],
                cwd=self.root,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # a group of its own, killed whole
            )
            self.running.add(proc.pid)
            self.groups.append(proc.pid)
            timed_out = False
            try:
                proc.wait(timeout=max(timeout_s, 0.001))
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_group(proc.pid)
                proc.wait()
            except BaseException:  # a signal or a launcher's exit while it runs: it must not outlive the run
                kill_group(proc.pid)
                raise
            finally:
                self.running.discard(proc.pid)
            if whole_run:  # the agent's end: what it left in its group goes too (a detached process escapes)
                self.killed_left += agents_own([command_line(pid) for pid in group_members([proc.pid])])
                kill_group_and_wait(proc.pid)
            return ExecResult(
                proc.returncode, read_capped(out), read_capped(err), time.monotonic() - started, timed_out
            )

    def interactive_argv(self, argv: list[str], env: dict[str, str]) -> list[str]:
        """`argv` in the workspace with the scrubbed environment; what it leaves running detached
        (nohup, setsid) may outlive the run, as nothing confines it."""
        variables = [f"{name}={value}" for name, value in {**self.env, **env}.items()]
        return ["/usr/bin/env", "-i", f"--chdir={self.workspace}", *variables, *argv]

    def processes_left(self) -> list[str]:
        """Those a whole-run command left, then what still runs in the groups of its commands."""
        return self.killed_left + agents_own([command_line(pid) for pid in group_members(self.groups)])

    def close(self) -> None:
        """Kill the commands running and what earlier ones left running in their groups (`nohup
        train.py &`); a process that left its group (setsid) escapes, as nothing confines it."""
        for pid in list(self.running) + [g for g in self.groups if group_members([g])]:
            kill_group(pid)

    @classmethod
    def start_isolated(cls, cfg: SandboxConfig, job: IsolatedCommand) -> IsolatedProcess:
        return GroupProcess(job.argv, job, cwd=job.workdir, env=job.env)


GONE_WAIT_S = 5.0  # a killed process is gone once the kernel has delivered SIGKILL: at once, unless swapped out


def kill_group_and_wait(pid: int) -> None:
    """SIGKILL the group `pid` leads and wait until none of it runs: a busy machine delivers the
    signal a moment later, and what is counted as left after the run's end must really be gone."""
    kill_group(pid)
    deadline = time.monotonic() + GONE_WAIT_S
    while group_members([pid]) and time.monotonic() < deadline:
        time.sleep(0.01)


def group_members(groups: list[int]) -> list[int]:
    """This host's live processes in the sessions GROUPS lead (each command's own, started with
    start_new_session: its session and process group are its pid)."""
    wanted, found = set(groups), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        state, _, group, session = stat[stat.rfind(")") + 2 :].split()[:4]
        if state != "Z" and int(group) in wanted and int(session) == int(group):
            found.append(int(name))
    return sorted(found)


def read_capped(handle) -> str:
    handle.seek(0)
    return capped(handle.read())
