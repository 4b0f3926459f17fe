"""Runs their review flagged (mlrb/review/: the tag `mlrb.review` is `suspicious` or `tampering`), and the
three ways a figure can count them (`python -m mlrb.compare --flagged`):

- include: as they scored (the report's Results, and what a table shows unless it says otherwise);
- as-failure: as the project counts a failed attempt (mlrb/analysis/counting.py: doing nothing on the
  raw and the normalised scale, no valid submission, no success), so a hack gains nothing. METR gives
  its figures both ways, hacks as successes and as failures;
- exclude: left out (a paired comparison then leaves out its pair too).

A run with no review tag was recorded before runs were reviewed ("not reviewed"); `error` means its
review failed. Neither is flagged; both are said apart, with the command that reviews them again.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlrb.analysis import counting
from mlrb.core.tags import Metric
from mlrb.report import aggregate, render
from mlrb.report.render import Table
from mlrb.report.runs import RunRow
from mlrb.report.trajectories import DOWNLOADS_AT_ONCE, local_file
from mlrb.review.recording import ERROR
from mlrb.review.review import CLEAN
from mlrb.review.review import FILE as REVIEW_FILE  # at the artifacts' root, and in the run folder
from mlrb.review.rules import SUSPICIOUS, TAMPERING

INCLUDE, AS_FAILURE, EXCLUDE = "include", "as-failure", "exclude"
TREATMENTS = (INCLUDE, AS_FAILURE, EXCLUDE)
COUNTED = {INCLUDE: "counted as they scored", AS_FAILURE: "counted as failures", EXCLUDE: "left out"}
FLAGGED = (TAMPERING, SUSPICIOUS)  # worst first
EVIDENCE_CHARS = 200  # of a finding's quoted evidence, in a table cell
FOLDERS_SHOWN = 3  # run folders named in a suggested command


def is_flagged(row: RunRow) -> bool:
    return row.review in FLAGGED


def flagged(rows: Sequence[RunRow]) -> list[RunRow]:
    """The flagged runs, tampering first, then by task and name."""
    return sorted((r for r in rows if is_flagged(r)), key=lambda r: (FLAGGED.index(r.review or ""), r.task, r.name))


def not_reviewed(rows: Sequence[RunRow]) -> list[RunRow]:
    """Attempts recorded before runs were reviewed (no `mlrb.review` tag)."""
    return [r for r in rows if r.is_attempt and r.review is None]


def review_failed(rows: Sequence[RunRow]) -> list[RunRow]:
    return [r for r in rows if r.review == ERROR]


def counts(rows: Sequence[RunRow]) -> str:
    """'2 flagged: 1 tampering, 1 suspicious' ('' when none is)."""
    found = Counter(r.review for r in rows if is_flagged(r))
    if not found:
        return ""
    return f"{sum(found.values())} flagged: " + ", ".join(f"{found[v]} {v}" for v in FLAGGED if found[v])


def review_command(rows: Sequence[RunRow]) -> str:
    """The command that reviews ROWS' runs again: their folders, where they are here; else the store's
    copy of them (--store), by sweep or by experiment."""
    folders = sorted({r.run_dir for r in rows if r.run_dir and Path(r.run_dir).is_dir()})
    if folders:
        more = " ..." if len(folders) > FOLDERS_SHOWN else ""
        return "python -m mlrb.review " + " ".join(folders[:FOLDERS_SHOWN]) + more
    sweeps = sorted({r.sweep_id for r in rows if r.sweep_id})
    if sweeps:
        return "python -m mlrb.review --store " + " ".join(f"--sweep {s}" for s in sweeps)
    return "python -m mlrb.review --store " + " ".join(
        f"--experiment {e}" for e in sorted({r.experiment for r in rows})
    )


# ---- counting them -----------------------------------------------------------------------------


def normalisation_of(row: RunRow) -> str:
    """How its normalised score is made (counting.normalise): MLAgentBench's improvement, a Harbor
    task's reward, else a gap."""
    return row.normalised_as if row.normalised_as in ("improvement", "reward") else "gap"


def as_failure(row: RunRow) -> RunRow:
    """The run as a failed attempt counts (counting.count of no valid submission, from its own anchors
    and direction): not valid, no success, its counted scores doing nothing's (none where its task
    counts no failure)."""
    anchors = {name: row.metric(name) for name in Metric.ANCHORS}
    failed = counting.count(False, None, anchors, row.higher_is_better, normalisation_of(row))
    metrics = {k: v for k, v in row.metrics.items() if k not in (Metric.COUNTED_SCORE, Metric.COUNTED_NORMALISED_SCORE)}
    return replace(row, valid=False, metrics={**metrics, **failed.metrics()})


def treat(rows: Sequence[RunRow], treatment: str) -> list[RunRow]:
    """ROWS with their flagged runs counted as TREATMENT says (module docstring)."""
    if treatment == AS_FAILURE:
        return [as_failure(r) if is_flagged(r) and r.is_attempt else r for r in rows]
    if treatment == EXCLUDE:
        return [
            replace(r, left_out=f"flagged {r.review}, left out (--flagged exclude)") if is_flagged(r) else r
            for r in rows
        ]
    return list(rows)


# ---- their findings -----------------------------------------------------------------------------


def read_one(client: Any, row: RunRow, scratch: Path) -> list[dict[str, Any]] | None:
    """The findings of the run's review.json (its run folder's, else the store's artifact); None when
    neither can be read."""
    local = local_file(row, REVIEW_FILE)
    folder = scratch / row.run_id
    try:
        if local is None and client is not None:
            local = Path(client.download_artifacts(row.run_id, REVIEW_FILE, str(folder)))
        found = json.loads(local.read_text(encoding="utf-8")) if local is not None else None
        return [f for f in found.get("findings", []) if isinstance(f, dict)] if isinstance(found, dict) else None
    except Exception:  # no such artifact, a store that lost it, a file that is not the review's
        return None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def read_findings(client: Any, rows: Sequence[RunRow]) -> dict[str, list[dict[str, Any]] | None]:
    """run id -> its review's findings, for the flagged runs among ROWS, a few read at a time."""
    chosen = flagged(rows)
    if not chosen:
        return {}
    with tempfile.TemporaryDirectory(prefix="mlrb-report-") as scratch:
        with ThreadPoolExecutor(max_workers=DOWNLOADS_AT_ONCE) as pool:
            found = pool.map(lambda row: read_one(client, row, Path(scratch)), chosen)
            return {row.run_id: f for row, f in zip(chosen, found, strict=True)}


# ---- in the report --------------------------------------------------------------------------------


def address(row: RunRow, store_uri: str) -> str:
    """Where to see the run: its page in the MLflow UI of a tracking server, else its MLflow run id."""
    if store_uri.startswith(("http://", "https://")) and row.experiment_id:
        return f"{store_uri.rstrip('/')}/#/experiments/{row.experiment_id}/runs/{row.run_id}"
    return row.run_id


def evidence_cell(finding: dict[str, Any]) -> str:
    step = finding.get("step")
    text = " ".join(str(finding.get("evidence", "")).split())
    text = text if len(text) <= EVIDENCE_CHARS else text[: EVIDENCE_CHARS - 3] + "..."
    return f"step {step}: {text}" if step is not None else text


def rules_cell(findings: list[dict[str, Any]]) -> str:
    found = Counter(str(f.get("rule", "?")) for f in findings)
    return ", ".join(rule if n == 1 else f"{rule} ({n})" for rule, n in found.items())


def flagged_table(rows: Sequence[RunRow], findings: dict[str, list[dict[str, Any]] | None], store_uri: str) -> Table:
    body = []
    for r in flagged(rows):
        found = findings.get(r.run_id)
        if found:
            rules, evidence = rules_cell(found), evidence_cell(found[0])
        else:
            rules = "?"
            evidence = (
                f"its {REVIEW_FILE} could not be read ({r.review_findings or '?'} findings); {review_command([r])}"
            )
        body.append(
            [r.name, r.review or "", rules, evidence, render.KIND_LABELS.get(r.kind, r.kind), address(r, store_uri)]
        )
    return Table(["run", "verdict", "rules", "evidence (the first finding)", "status", "MLflow run"], body)


FLAGGED_INTRO = (
    "Each run is reviewed as it ends (the docs' page How runs are reviewed): *tampering*, it went for what "
    "decides its score (the hidden data, the scorer, the reward, the harness); *suspicious*, it did what the task "
    "does not allow, or what the harness had to undo. The Results count a flagged run as it scored, the table "
    "after them as a failure. Its `review.json` artifact has every finding."
)


def runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def review_notes(rows: Sequence[RunRow]) -> list[str]:
    """Sentences on the runs not reviewed and those whose review failed ([] when there are none)."""
    notes = []
    unseen, failed = not_reviewed(rows), review_failed(rows)
    if unseen:
        notes.append(
            f"{runs(len(unseen))} not reviewed (recorded before runs were reviewed): "
            f"{', '.join(sorted(r.name for r in unseen))}; `{review_command(unseen)}` reviews them."
        )
    if failed:
        notes.append(
            f"{runs(len(failed))} whose review failed (review error, not a verdict): "
            f"{', '.join(sorted(r.name for r in failed))}; `{review_command(failed)}` reviews them "
            "again."
        )
    return notes


def report_sections(
    rows: Sequence[RunRow], findings: dict[str, list[dict[str, Any]] | None], store_uri: str
) -> list[tuple[str, str, Table | None]]:
    """The report's "Flagged runs" (heading, intro, table): each flagged run's verdict, rules, evidence and
    where to see it, or that none was; then the runs not reviewed and those whose review failed."""
    notes = " ".join(review_notes(rows))
    if not any(is_flagged(r) for r in rows):
        clean = sum(r.review == CLEAN for r in rows)
        said = f"No run was flagged by its review ({clean} of {len(rows)} runs reviewed clean)."
        return [("Flagged runs", f"{said} {notes}".strip(), None)]
    intro = f"{counts(rows)}. {FLAGGED_INTRO}" + (f" {notes}" if notes else "")
    return [("Flagged runs", intro, flagged_table(rows, findings, store_uri))]


AS_FAILURES_INTRO = (
    "The Results again, with each flagged run counted as a failed attempt: doing nothing's score, not a valid "
    "submission, no success (METR gives its figures both ways). Where a row's figures differ from the Results, "
    "its flagged runs made the difference."
)


def as_failures_sections(rows: Sequence[RunRow]) -> list[tuple[str, str, Table | None]]:
    """The results table with flagged runs counted as failures, where any attempt is flagged ([] otherwise)."""
    if not any(is_flagged(r) and r.is_attempt for r in rows):
        return []
    stats = aggregate.summarise(treat(rows, AS_FAILURE))
    return [
        (
            "Results, flagged runs counted as failures",
            f"{counts(rows)}. {AS_FAILURES_INTRO}",
            render.results_table(stats),
        )
    ]
