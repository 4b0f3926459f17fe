"""A run that goes on where it was, instead of over, when its process ended before the run
was recorded: a job's time limit or pre-emption (submitit requeues it), a node that failed,
SIGKILL. Running the same command again (or the job's requeue) finds the run folder and goes
on in it: the workspace as the agent left it, the budget already spent carried, the agent's
own state kept in the run folder (`agent_state/`), the trajectory and the record continued
as one run with one more attempt. `resume=false` starts over instead.

Three files of the run folder make it possible:

- `.mlrb-run`, the claim: who runs the run folder now (host, process and its start, SLURM
  job), for which run (its key and sweep), refreshed every few seconds while it runs (the
  heartbeat);
- `progress.json`: the agent's spend so far (steps, tokens, dollars, its clock) and whether
  it has ended (with its outcome), written whenever it changes and every few seconds;
- `record.jsonl` (mlrb/store/record.py): a run whose record holds its end (`status`) is over and
  never resumed.

A run folder is resumed only when its owner is gone: on this host, its process has ended;
elsewhere, its SLURM job is this one (a requeue) or its heartbeat stopped long ago.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlrb.core import disk
from mlrb.core.leftovers import process_start
from mlrb.core.tags import Metric

log = logging.getLogger(__name__)

CLAIM = ".mlrb-run"  # in a run folder: who runs it now
PROGRESS = "progress.json"
AGENT_STATE = "agent_state"  # the agent's own state across attempts (a conversation, a session id)
HEARTBEAT_S = 5.0  # how often a running run's claim and progress are refreshed
# A claim from another host whose heartbeat is older than this belongs to a run whose node
# went away (no process of another host can be asked whether it lives).
STALE_AFTER_S = 600.0


@dataclass(frozen=True)
class Owner:
    """Who claimed a run folder, and for which run."""

    key: str = ""  # the run's key (mlrb/harness/plan.py run_key)
    sweep_id: str = ""
    host: str = ""
    pid: int = 0
    pid_started: str = ""  # the process's start time (/proc/PID/stat), so a reused PID is not taken for it
    slurm_job_id: str = ""

    def alive(self) -> bool:
        """Whether the owner may still be running the run (unknown counts as alive)."""
        if self.host == socket.gethostname():
            return bool(self.pid) and process_start(self.pid) == self.pid_started and bool(self.pid_started)
        return not (self.slurm_job_id and self.slurm_job_id == slurm_job_id())


def slurm_job_id() -> str:
    """This process's SLURM job (an array task as JOB_TASK); a requeued job keeps its id."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "")


def me(key: str, sweep_id: str | None) -> Owner:
    return Owner(key, sweep_id or "", socket.gethostname(), os.getpid(), process_start(os.getpid()), slurm_job_id())


def read_owner(run_dir: Path) -> Owner | None:
    """The claim of RUN_DIR, or None (no claim, or one an older mlrb wrote: a bare PID)."""
    try:
        data = json.loads((Path(run_dir) / CLAIM).read_text())
        return Owner(**{k: v for k, v in data.items() if k in Owner.__dataclass_fields__})
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def write_owner(run_dir: Path, owner: Owner, exclusive: bool = False) -> bool:
    """Write the claim; with EXCLUSIVE, only if there is none yet (False when there is one)."""
    path = Path(run_dir) / CLAIM
    data = json.dumps(asdict(owner)) + "\n"
    if exclusive:
        try:
            with open(path, "x") as f:
                f.write(data)
            return True
        except FileExistsError:
            return False
    atomic_write(path, data)
    return True


def atomic_write(path: Path, text: str) -> None:
    """PATH holds TEXT, or what it held before (a full disk asks the agent's disk guard for room first)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    disk.with_room(lambda: disk.replace_whole(path, temporary, lambda part: part.write_text(text)))


def ended(run_dir: Path) -> bool:
    """Whether the run's record holds its end (a run recorded FINISHED, FAILED or KILLED)."""
    from mlrb.store import record

    path = Path(run_dir) / record.FILE
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().splitlines()
    except OSError:
        return False
    for raw in reversed(lines):
        try:
            return json.loads(raw).get("kind") == "status"
        except ValueError:
            continue  # a line cut by the kill
    return False


def resumable(run_dir: Path, key: str, sweep_id: str | None) -> bool:
    """Whether RUN_DIR holds this run (KEY, SWEEP_ID), begun, not ended, its owner gone."""
    run_dir = Path(run_dir)
    owner = read_owner(run_dir)
    if owner is None or owner.key != key or owner.sweep_id != (sweep_id or ""):
        return False
    if not (run_dir / "record.jsonl").is_file() or ended(run_dir):
        return False
    if owner.alive():
        heartbeat = (run_dir / CLAIM).stat().st_mtime
        return owner.host != socket.gethostname() and time.time() - heartbeat > STALE_AFTER_S
    return True


def find(run_dir: Path, key: str, sweep_id: str | None) -> Path | None:
    """The run folder to go on in: RUN_DIR itself (a requeued job's), or the newest of its
    siblings holding this run unfinished (a single run's `outputs/runs/*`; a sweep's jobs,
    `outputs/sweeps/*/*`, as a sweep launched again names its folder anew)."""
    run_dir = Path(run_dir).resolve()
    if resumable(run_dir, key, sweep_id):
        return run_dir
    root, pattern = (run_dir.parent.parent, f"*/*/{CLAIM}") if sweep_id else (run_dir.parent, f"*/{CLAIM}")
    if not root.is_dir():
        return None
    found = [claim.parent for claim in root.glob(pattern) if resumable(claim.parent, key, sweep_id)]
    return max(found, key=lambda p: (p / CLAIM).stat().st_mtime) if found else None


def folders_by_job(sweeps: Path, sweep_id: str) -> dict[str, list[Path]]:
    """The run folders of a sweep's jobs under SWEEPS, the folder of the sweeps' folders
    (`outputs/sweeps`), every launch's: by the job's key, newest first."""
    found: dict[str, list[tuple[float, Path]]] = {}
    for claim in Path(sweeps).glob(f"*/*/{CLAIM}"):
        owner = read_owner(claim.parent)
        if owner is not None and owner.sweep_id == sweep_id:
            found.setdefault(owner.key, []).append((claim.stat().st_mtime, claim.parent))
    return {key: [folder for _, folder in sorted(folders, reverse=True)] for key, folders in found.items()}


def ended_state(run_dir: Path) -> dict[str, Any] | None:
    """The folded record of a run that ended (mlrb/store/record.py `fold`); None when it did not, or
    its record cannot be read."""
    from mlrb.store import record

    if not ended(run_dir):
        return None
    try:
        return record.fold(record.read(run_dir))
    except (OSError, ValueError):  # a record this mlrb cannot read
        return None


def earlier_attempt(run_dir: Path, key: str, sweep_id: str) -> tuple[str, int] | None:
    """A sweep's job run again after its run ended unfinished (FAILED or KILLED: a retry, or the
    sweep launched again): that run's id and last attempt, from the newest such run folder of
    the sweep's launches, so the job goes on as the same run with one more attempt, in a folder
    of its own. None when there is none."""
    for folder in folders_by_job(Path(run_dir).resolve().parent.parent, sweep_id).get(key, []):
        state = ended_state(folder)
        if state is not None and state["status"] in ("FAILED", "KILLED") and state["run_id"]:
            return state["run_id"], int(state["attempt"] or 1)
    return None


def take_over(run_dir: Path, key: str, sweep_id: str | None, attempt: int) -> bool:
    """Claim a resumable run folder for ATTEMPT, atomically: of two processes that would
    resume it at once, one gets it (the other starts a run of its own)."""
    marker = Path(run_dir) / f".mlrb-attempt-{attempt}"
    try:
        with open(marker, "x") as f:
            f.write(f"{socket.gethostname()} {os.getpid()}\n")
    except FileExistsError:
        return False
    write_owner(run_dir, me(key, sweep_id))
    return True


@contextlib.contextmanager
def heartbeat(run_dir: Path) -> Iterator[None]:
    """While the block runs, the run folder's claim is refreshed every HEARTBEAT_S: the sign,
    from another host, that the run is alive (`resumable`), whatever stage it is in."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(Path(run_dir) / CLAIM)

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@dataclass(frozen=True)
class Resumption:
    """A run that goes on in a new attempt."""

    attempt: int  # this attempt (the first is 1)
    run_id: str  # the run's, in the tracking store and its record
    why: str  # how the attempt before ended, as far as anyone knows
    progress: Progress | None  # what the attempts before spent, and the agent's end if it came
    state_dir: Path  # the agent's own state, kept across attempts


@dataclass
class Progress:
    """What the agent has spent so far, and how it ended once it has."""

    attempt: int = 1
    steps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0  # of the input tokens
    cache_write_tokens: int = 0
    web_searches: int = 0  # billed beside tokens, and their dollars (within cost_usd)
    fee_usd: float = 0.0
    cost_usd: float = 0.0
    agent_time_s: float = 0.0
    gpu_hours: float = 0.0  # the hardware the agent's sandbox held (mlrb/core/compute.py)
    cpu_hours: float = 0.0
    # What calls in flight held when this was written: a kill mid-call charges it (fail closed)
    held_input_tokens: int = 0
    held_output_tokens: int = 0
    held_usd: float = 0.0
    outcome: dict[str, Any] | None = None  # the agent's outcome once it ended (the run then only scores)
    spent: dict[str, Any] | None = None  # its final spend, with the outcome
    saved_at: float = field(default_factory=time.time)

    def spent_with_held(self) -> dict[str, float]:
        """What the attempts so far spent (Metric.SPENT's keys), with what calls in flight held when
        this was written charged too: a kill mid-call is not free (fail closed)."""
        spent = {key: getattr(self, key) for key in Metric.SPENT}
        spent[Metric.INPUT_TOKENS] += self.held_input_tokens
        spent[Metric.OUTPUT_TOKENS] += self.held_output_tokens
        spent[Metric.COST_USD] += self.held_usd
        return spent


def load(run_dir: Path) -> Progress | None:
    try:
        data = json.loads((Path(run_dir) / PROGRESS).read_text())
    except (OSError, ValueError):
        return None
    return Progress(**{k: v for k, v in data.items() if k in Progress.__dataclass_fields__})


def save(run_dir: Path, progress: Progress) -> None:
    progress.saved_at = time.time()
    atomic_write(Path(run_dir) / PROGRESS, json.dumps(asdict(progress)) + "\n")


class Keeper:
    """Keeps a running agent's progress saved: on every change of its budget (a step, a model
    call charged), every HEARTBEAT_S, and as it stops."""

    def __init__(self, run_dir: Path, attempt: int, budget: Any, also: Callable[[], float | None] | None = None):
        """ALSO: called with each save (the agent's budget file, mlrb/harness/agent_clock.py); what it
        returns, when a number, is how soon it wants to be called again."""
        self.run_dir, self.attempt, self.budget, self.also = Path(run_dir), attempt, budget, also
        self.next_in_s = HEARTBEAT_S
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.beat, name="progress", daemon=True)

    def save(self) -> None:
        b = self.budget
        gpu_hours, cpu_hours = b.compute.hours() if b.compute is not None else (0.0, 0.0)
        with self.lock:
            save(
                self.run_dir,
                Progress(
                    attempt=self.attempt,
                    steps=b.steps,
                    input_tokens=b.input_tokens,
                    output_tokens=b.output_tokens,
                    cache_read_tokens=b.cache_read_tokens,
                    cache_write_tokens=b.cache_write_tokens,
                    web_searches=b.web_searches,
                    fee_usd=b.fee_usd,
                    cost_usd=b.usd,
                    agent_time_s=b.elapsed_s(),
                    gpu_hours=gpu_hours,
                    cpu_hours=cpu_hours,
                    held_input_tokens=b.held.input_tokens,
                    held_output_tokens=b.held.output_tokens,
                    held_usd=b.held.usd,
                ),
            )
            if self.also is not None:
                self.next_in_s = min(HEARTBEAT_S, self.also() or HEARTBEAT_S)

    def beat(self) -> None:
        while not self.stop.wait(self.next_in_s):
            try:
                self.save()
            except OSError as e:  # a full disk: the run goes on, resuming it may lose a little
                log.warning("could not save the run's progress: %s", e)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self.save()
        self.budget.on_change = self.save
        self.thread.start()
        try:
            yield
        finally:  # saved once more as the agent stops, whatever stops it (a launcher's requeue: its clock to the end)
            self.stop.set()
            self.thread.join()
            self.budget.on_change = None
            with contextlib.suppress(OSError):
                self.save()

    def ended(self, outcome: dict[str, Any], spent: dict[str, Any]) -> None:
        """The agent's end, final: a later attempt goes straight to scoring."""
        with self.lock:
            save(
                self.run_dir,
                Progress(
                    attempt=self.attempt, outcome=outcome, spent=spent, **{k: spent.get(k, 0) for k in Metric.SPENT}
                ),
            )
