"""A review's verdict as the run's tags (`mlrb.review`, `mlrb.review_findings`) and its review.json
as the run's artifact: lines appended to the run folder's record (mlrb/store/record.py), as a
rescoring's are, then written to the run in the store it was recorded for, when that store can be
reached. A store that cannot is said in a line; `python -m mlrb.sync RUN_DIR` uploads the lines later.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from mlrb.core import console, disk
from mlrb.core.config import ConfigError, ReviewConfig
from mlrb.core.messages import first_line
from mlrb.core.tags import Metric, Tag
from mlrb.review.review import FILE, Review, review_folder
from mlrb.store import record

log = logging.getLogger(__name__)
ERROR = "error"  # the tag's value when the review itself failed


def tags_of(done: Review) -> dict[str, str]:
    tags = {Tag.REVIEW: done.verdict, Tag.REVIEW_FINDINGS: str(len(done.findings))}
    return {**tags, Tag.REVIEW_JUDGE: done.judge["status"]} if done.judge is not None else tags


def metrics_of(done: Review) -> dict[str, float]:
    """What the review's judge used and cost, apart from the agent's spending ({} without a judge)."""
    if done.judge is None:
        return {}
    return {name: done.judge.get(name, 0) for name in Metric.REVIEW_JUDGE_SPENT}


def judged_by(cfg: ReviewConfig | None) -> Any:
    """What adds the judge's read to a review, when CFG names a judge (its modules imported only then)."""
    if cfg is None or not cfg.judge:
        return None
    from mlrb.review.judge import judge_for

    return judge_for(cfg)


def review_at_end(run_dir: Path, recorder: Any, cfg: ReviewConfig | None = None) -> None:
    """The run reviewed as it ends (mlrb/run.py), by the rules and the judge CFG names, its verdict,
    the judge's cost and review.json through its own recorder. A review that fails never fails the
    run: a warning, its traceback in the run's log, and the tag `mlrb.review` = "error" (`python -m
    mlrb.review` reviews it again); a judge that fails is the judge's status in review.json."""
    try:
        done = review_folder(Path(run_dir), judged_by(cfg))
    except Exception as e:
        log.warning("the run's review failed: %s", first_line(e))
        log.warning("the review's traceback", exc_info=e, extra=console.LOG_FILE_ONLY)
        recorder.set_tags({Tag.REVIEW: ERROR})
        return
    if done.findings:
        log.info("review: %s", done.line())
    if done.judge is not None:
        log.info(
            "review: the judge (%s): %s, $%.4f",
            done.judge["model"],
            done.judge["status"],
            done.judge[Metric.REVIEW_JUDGE_COST_USD],
        )
        recorder.log_metrics(metrics_of(done))
    recorder.set_tags(tags_of(done))
    recorder.log_file(Path(run_dir) / FILE)


def record_review(run_dir: Path, done: Review) -> str:
    """The review's tags and artifact, into the run's record and its store; returns where they went."""
    run_dir = Path(run_dir)
    state = record.fold(record.read(run_dir))
    tags = json.loads(record.line_of("tags", tags=tags_of(done)))
    artifact = json.loads(record.line_of("artifact", file=FILE, artifact_path=None, is_dir=False))
    metrics = [json.loads(record.line_of("metrics", metrics=metrics_of(done), step=0))] if done.judge else []
    new = [tags, *metrics] + ([artifact] if (FILE, None, False) not in map(tuple, state["artifacts"]) else [])
    for line in new:
        disk.append_whole(run_dir / record.FILE, (json.dumps(line) + "\n").encode("utf-8"))
    try:
        client = store_client(run_dir)
        from mlrb.store import tracking

        run = tracking.find_run(client, state["run_id"])
        if run is None:
            return f"not in its store yet (`python -m mlrb.sync {run_dir}` uploads it)"
        writer = tracking.MlflowRunWriter(client, run.info.run_id, run.info.experiment_id)
        record.export(writer, [tags, *metrics, artifact], run_dir)  # review.json again: its content is new
    except Exception as e:  # a store away, a password the record does not keep: the record has it
        return f"not written to its store ({first_line(e)}); `python -m mlrb.sync {run_dir}` uploads it"
    return f"tagged in its store (run {run.info.run_id})"


def store_client(run_dir: Path) -> Any:
    """A client of the store RUN_DIR's run was recorded for; ConfigError when there is none to reach
    (a SQLite store that is not there is not made: the run's own store is gone)."""
    from mlrb.store import tracking
    from mlrb.sync import recorded_store

    cfg = recorded_store(run_dir)
    uri = cfg.named_uri()
    database = tracking.sqlite_path(uri) if uri else Path(cfg.dir).expanduser() / "mlflow.db"
    if database is not None and not database.is_file():
        raise ConfigError(f"its store {database} is not there")
    if uri and uri.startswith(("http://", "https://")):
        return tracking.reading_client(uri)
    client, _ = tracking.client_for(cfg)
    return client
