"""The run folder's record: every fact of a run that goes to the tracking store, appended to
`<run folder>/record.jsonl` as it happens, before it is sent.

Each line is one JSON object with the format's version `v`, the time `t` (Unix seconds) and
a `kind`:

- `opened`: the run's `run_id` (the harness makes it; the store's run carries it as the tag
  `mlrb.run_id`), the `experiment`'s and the run's name (`run_name`), the `attempt`, the
  `tags` the run was opened with (a resumed run appends a second `opened` with the next
  attempt) and the `store` (its `uri`, any password masked, or the `dir` of its SQLite store);
- `params`: `params`, name -> value;
- `tags`: `tags`, name -> value (a later value replaces an earlier one);
- `metrics`: `metrics`, name -> value, at `step`;
- `artifact`: a file or folder (`is_dir`) of the run folder (`file`, relative to it, or
  absolute when it lies outside) logged under `artifact_path` (null: the artifacts' root; a
  folder's files go under it, a file goes into it under its own name); texts the run
  logs (the config, the instructions, the workspace's diff, the score report) are written
  into `record/` first, so every artifact is a file in the run folder;
- `trace`: one step's trace (`trace`: its step, session and spans, as
  mlrb/store/tracing.py builds them);
- `status`: the run's end, `status` (FINISHED, FAILED or KILLED).

The agent's events are in `trajectory.jsonl` beside it. `fold` turns the lines into what the
store holds, and `python -m mlrb.sync` (mlrb/sync.py) puts what a store lacks of it into
that store, through the same `export`.

The store is written from the record, by one exporter: the recording process
(mlrb/store/recording_process.py), which reads each line back from the file once the harness has
appended it and writes it with `export`, the one place where a record line becomes an MLflow
call; the `opened` line opens the store's run there. The harness never waits for it during
the run: only at the run's end, for the lines still on their way (`RecordedRun.finish`).

When the store cannot be reached in the middle of a run (a server or database away), the run
goes on and ends as it would: its record stays complete, and the run ends saying it is not yet
in the store (`RecordedRun.store_error`); `python -m mlrb.sync RUN_DIR` uploads it to the store
the run was recorded for (the `store` of its `opened` line), or relaunching its sweep does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlrb.core import disk
from mlrb.core.messages import first_line
from mlrb.core.tags import Tag
from mlrb.store.tracking import MlflowRunWriter, StoreAway, opening_tags, store_unreachable

log = logging.getLogger(__name__)

VERSION = 1
FILE = "record.jsonl"
TEXTS = "record"  # the folder, in the run folder, of the texts a run logs as artifacts


class RecordedRun:
    """A run's recorder: each call is a line appended to the run folder's record, which the
    recording process then exports to the store (`recording_process.ExportedStoreRun`)."""

    def __init__(
        self,
        store_run: Any,
        run_dir: Path,
        experiment: str,
        run_name: str,
        tags: dict[str, Any],
        run_id: str,
        attempt: int = 1,
    ):
        """The run RUN_ID's ATTEMPT, opened in EXPERIMENT as RUN_NAME with TAGS: its `opened` line,
        which STORE_RUN's export opens the store's run with."""
        self.store_run = store_run
        self.run_id = run_id
        self.attempt = attempt
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / FILE
        self.store_error: str | None = None  # why the store could not be reached, once it could not
        disk.mend(self.path)  # an earlier attempt's last line cut short: gone before this one's lines
        opening = opening_tags({**tags, Tag.RUN_ID: run_id}, attempt)
        self._append(
            "opened",
            run_id=run_id,
            experiment=experiment,
            run_name=run_name,
            attempt=attempt,
            tags=opening,
            store=store_run.store,
        )

    @property
    def shown_id(self) -> str:
        """The id a user finds the run by: the store's, once the store has opened the run (what
        `mlflow ui` shows), else the run's own (its record's, and the store run's `mlrb.run_id` tag)."""
        opened = self.store_run.opened_as
        return opened[0] if opened else self.run_id

    def _append(self, kind: str, **fields: Any) -> None:
        """Append one line, then hand it to the store's run to export (unless the store has been
        away); an export of an earlier line that the store refused raises here."""
        data = line_of(kind, **fields).encode("utf-8")
        offset = self.path.stat().st_size if self.path.exists() else 0  # (one writer: the harness)
        disk.append_whole(self.path, data)
        if self.store_error is not None:
            return  # a store that was away gets the record by sync
        with self.store_failures():
            self.store_run.export(self.path, offset, len(data), opens=kind == "opened")

    @contextlib.contextmanager
    def store_failures(self) -> Iterator[None]:
        """A store that cannot be reached: noted once, and the run goes on without it. A store that
        refused what was sent: a failure of the run, as before."""
        try:
            yield
        except Exception as e:
            if not (isinstance(e, StoreAway) or store_unreachable(e)):
                raise
            self.store_error = first_line(e)
            log.warning(
                "the tracking store cannot be reached (%s); the run goes on and keeps its record in %s: "
                "`python -m mlrb.sync %s` uploads it once the store is back",
                self.store_error,
                self.path,
                self.run_dir,
            )

    def _artifact(self, path: Path, folder: str | None, is_dir: bool = False) -> None:
        path = Path(path)
        file = str(path.relative_to(self.run_dir)) if path.is_relative_to(self.run_dir) else str(path)
        self._append("artifact", file=file, artifact_path=folder, is_dir=is_dir)

    def log_params(self, params: dict[str, str]) -> None:
        self._append("params", params=params)

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._append("tags", tags={k: str(v) for k, v in tags.items()})

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        self._append("metrics", metrics={k: float(v) for k, v in metrics.items() if v is not None}, step=step)

    def log_text(self, text: str, name: str) -> None:
        kept = self.run_dir / TEXTS / name
        kept.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # say, a file name that is not UTF-8 (a surrogate escape): written escaped
            data = text.encode("utf-8", "backslashreplace")
            log.warning("%s: characters that UTF-8 cannot hold are written as backslash escapes", name)
        disk.with_room(lambda: kept.write_bytes(data))
        folder = str(Path(name).parent)
        self._artifact(kept, None if folder == "." else folder)

    def log_file(self, path: Path, folder: str | None = None) -> None:
        if Path(path).exists():  # a file that is not there is not logged
            self._artifact(Path(path), folder)

    def log_folder(self, path: Path, folder: str) -> None:
        self._artifact(Path(path), folder, is_dir=True)

    def log_trace(self, trace: dict[str, Any]) -> None:
        self._append("trace", trace=trace)

    def logged_params(self) -> dict[str, str]:
        """The params the record holds, from every attempt of the run so far."""
        return fold(read(self.run_dir))["params"]

    def finish(self, status: str) -> None:
        """The run's end; returns once the store holds the whole record, or is found away."""
        self._append("status", status=status)
        if self.store_error is None:
            with self.store_failures():
                self.store_run.flush()


def lines_at(path: Path, offset: int, length: int) -> list[dict]:
    """The record's lines in bytes [offset, offset + length) of PATH."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    return [json.loads(text) for text in data.decode("utf-8").splitlines()]


def export(recorder: MlflowRunWriter, lines: list[dict], run_dir: Path) -> None:
    """Write record lines of the run folder RUN_DIR to the store's run: the one place where a
    record line becomes a store call, for a live run (the recording process) and for what
    `python -m mlrb.sync` finds missing alike. An `opened` line is the store's run itself
    (`tracking.open_run`): nothing to write here."""
    for line in lines:
        match line["kind"]:
            case "params":
                recorder.log_params(line["params"])
            case "tags":
                recorder.set_tags(line["tags"])
            case "metrics":
                recorder.log_metrics(line["metrics"], step=line["step"], timestamp_ms=int(line["t"] * 1000))
            case "artifact":
                file = Path(line["file"]) if Path(line["file"]).is_absolute() else run_dir / line["file"]
                if line["is_dir"]:
                    recorder.log_folder(file, line["artifact_path"])
                else:
                    recorder.log_file(file, line["artifact_path"])
            case "trace":
                recorder.log_trace(line["trace"])
            case "status":
                recorder.finish(line["status"])


def new_run_id() -> str:
    """A new run's own id: 32 hex digits, as MLflow's run ids are (a UUID4)."""
    return uuid.uuid4().hex


def line_of(kind: str, **fields: Any) -> str:
    """One record line, its newline included: the format's version, the time, the kind, the fields."""
    return json.dumps({"v": VERSION, "t": round(time.time(), 3), "kind": kind, **fields}, default=str) + "\n"


def append_after(run_dir: Path | None, recorder: MlflowRunWriter, kind: str, **fields: Any) -> None:
    """A line added to a run after its end (a step rescored, a report's note on a sweep's run):
    appended to its record when its folder is here (RUN_DIR), then written to its run in the
    store by the same exporter, so the record stays the whole run and a later sync finds it
    in the store."""
    line = line_of(kind, **fields)
    if run_dir is not None and (Path(run_dir) / FILE).is_file():
        disk.append_whole(Path(run_dir) / FILE, line.encode("utf-8"))
    export(recorder, [json.loads(line)], Path(run_dir or "."))


def read(run_dir: Path) -> list[dict]:
    """The record's lines, in order. A last line cut short (a process killed as it wrote it, by a
    record written before lines were written whole) is skipped: a line ends with its newline."""
    path = Path(run_dir) / FILE
    text = path.read_text(encoding="utf-8", errors="replace")
    whole = text if text.endswith("\n") or not text else text[: text.rfind("\n") + 1]
    if whole != text:
        log.warning("%s: its last line was cut short (%d bytes), and is left out", path, len(text) - len(whole))
    lines = [json.loads(line) for line in whole.splitlines() if line.strip()]
    newer = [line for line in lines if line.get("v") != VERSION]
    if newer:
        raise ValueError(f"{path}: record format version {newer[0].get('v')}, this mlrb reads {VERSION}")
    return lines


def fold(lines: list[dict]) -> dict[str, Any]:
    """What the store holds after these lines: the last attempt's run_id and attempt, params,
    tags (last value wins), each metric's history as [step, value] pairs, the artifacts as
    (file, artifact_path, is_dir), the traces and the status (None while the run is open)."""
    state: dict[str, Any] = {
        "run_id": None,
        "attempt": None,
        "params": {},
        "tags": {},
        "metrics": {},
        "artifacts": [],
        "traces": [],
        "status": None,
    }
    for line in lines:
        match line["kind"]:
            case "opened":
                state.update(run_id=line["run_id"], attempt=line["attempt"], status=None)
                state["tags"].update(line["tags"])
            case "params":
                state["params"].update(line["params"])
            case "tags":
                state["tags"].update(line["tags"])
            case "metrics":
                for key, value in line["metrics"].items():
                    state["metrics"].setdefault(key, []).append([line["step"], value])
            case "artifact":
                state["artifacts"].append((line["file"], line["artifact_path"], line["is_dir"]))
            case "trace":
                state["traces"].append(line["trace"])
            case "status":
                state["status"] = line["status"]
    return state
