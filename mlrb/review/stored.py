"""Runs reviewed from what their tracking store keeps, for runs whose folders are gone (a cluster's
scratch cleaned, a store shared by a colleague): the run's tags and params, the step traces (the
proxy's refusals), and the artifacts the harness logged (the trajectory, the workspace's patch and
notes, the agent's transcript, the snapshots' step list and manifests), laid out in a scratch folder as they are
in a run folder so that the review reads them as it reads a live run's. The verdict goes back to
the run in the store: its tags and review.json.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from mlrb.core.retries import with_retries
from mlrb.core.tags import Tag
from mlrb.review import evidence as evidence_lib
from mlrb.review.recording import tags_of
from mlrb.review.review import Review, review, write
from mlrb.run_files import snapshots
from mlrb.run_files.trajectory import parse

# Where the harness logs each file the review reads (mlrb/run.py's record stage) -> its place in a run folder.
ARTIFACTS = {
    "trajectory.jsonl": Path("trajectory.jsonl"),
    "workspace.patch": evidence_lib.PATCH,
    "workspace_notes.txt": evidence_lib.NOTES,
    f"snapshots/{snapshots.STEPS}": Path("snapshots") / snapshots.STEPS,
    f"snapshots/{snapshots.TREES}": Path("snapshots") / snapshots.TREES,  # the steps' manifests: a folder
}
TRANSCRIPTS = "agent"  # an outside agent's printed output, a file per program


def review_stored(client: Any, run: Any) -> Review:
    """RUN (an MLflow run the harness recorded) reviewed from its store, the verdict written back to it."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per file said nothing here
    with tempfile.TemporaryDirectory(prefix="mlrb-review-") as scratch:
        folder = Path(scratch)
        fetch_artifacts(client, run.info.run_id, folder)
        events = list(parse(read_lines(folder / "trajectory.jsonl")))
        found = evidence_lib.assemble(
            folder,
            run.info.run_name or run.info.run_id,
            dict(run.data.tags),
            dict(run.data.params),
            [e for e in events if "event" in e],
            traces_of(client, run),
        )
        done = review(found)
        write_back(client, run, done, folder)
    return done


def fetch_artifacts(client: Any, run_id: str, folder: Path) -> None:
    """The artifacts the review reads, downloaded into FOLDER at their run-folder places; one the run
    did not log is left out (a run without notes, a built-in agent without a transcript)."""
    logged = {entry.path: entry for entry in with_retries(client.list_artifacts, run_id)}
    if "snapshots" in logged:
        logged |= {e.path: e for e in with_retries(client.list_artifacts, run_id, "snapshots")}
    for name, place in ARTIFACTS.items():
        if name in logged:
            download(client, run_id, name, folder / place)
    if TRANSCRIPTS in logged:
        for entry in with_retries(client.list_artifacts, run_id, TRANSCRIPTS):
            if not entry.is_dir and entry.path.endswith(".txt"):
                download(client, run_id, entry.path, folder / entry.path)


def download(client: Any, run_id: str, name: str, place: Path) -> None:
    place.parent.mkdir(parents=True, exist_ok=True)
    into = tempfile.mkdtemp(dir=place.parent)
    Path(with_retries(client.download_artifacts, run_id, name, into)).replace(place)


def read_lines(file: Path) -> list[str]:
    return file.read_text(encoding="utf-8", errors="replace").splitlines() if file.is_file() else []


def traces_of(client: Any, run: Any) -> list[dict[str, Any]]:
    """The run's step traces as its record keeps them (mlrb/store/tracing.py): each a dict with its
    step and its spans' type, status and attributes, which is what the review reads of them."""
    stored = with_retries(lambda: client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id))
    traces = []
    for trace in stored:
        step = trace.info.tags.get(Tag.STEP)
        spans = [
            {
                "span_type": span.span_type,
                "status": getattr(span.status.status_code, "value", str(span.status.status_code)),
                "status_description": span.status.description,
                "attributes": dict(span.attributes),
            }
            for span in trace.data.spans
        ]
        traces.append({"step": int(step) if step and step.isdigit() else 0, "spans": spans})
    return traces


def write_back(client: Any, run: Any, done: Review, folder: Path) -> None:
    """The verdict's tags and review.json onto RUN in its store."""
    from mlrb.store import tracking

    writer = tracking.MlflowRunWriter(client, run.info.run_id, run.info.experiment_id)
    writer.set_tags(tags_of(done))
    writer.log_file(write(folder, done))
