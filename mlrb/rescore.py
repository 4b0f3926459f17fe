"""Score steps of a finished run, as MLAgentBench allows:

    python -m mlrb.rescore RUN_ID --step N [--tracking-dir mlruns | --tracking-uri URI]
    python -m mlrb.rescore RUN_ID --all-steps      # or --every N: for the report's anytime curves

The run's step snapshots rebuild the workspace as it was after step N: its run folder's
(`snapshots/`) when the folder is on this machine, else the artifact `snapshots/` the store
holds (what `record.snapshots` sent: a content kept in the run folder only is named, and
refused in one line); the task's read-only files are restored, and the submission is scored as the
run's own was (same task config, same kind of scoring sandbox, the cached assets).

`--step N` prints the score and logs it to the run as the metric `step_score` at step N.
What is logged goes to the store and, when the run's folder is on this machine, to its
record (record.jsonl) too, as the run's own metrics do.
`--all-steps` (`--every N`: every Nth step and the last) scores each step in turn, once per
distinct workspace (a step that left the workspace as an earlier one did takes that step's
score), and logs at each step the anytime metrics (mlrb/analysis/anytime.py): validity, raw,
normalised and counted normalised score on the run's own anchors, the wall time since the
agent started and the dollars spent by then. Bad input is one line on stderr, exit status 2;
a scorer that fails (an infrastructure fault, not the run's) is one line, exit status 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from mlrb.analysis import anytime
from mlrb.core.config import ConfigError
from mlrb.core.messages import duration
from mlrb.core.tags import Metric, Tag
from mlrb.tasks.handling import in_environment


class ScoringFailed(RuntimeError):
    """The scorer itself failed on a step (exit status 1)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mlrb.rescore",
        description="Score steps of a finished mlrb run from its step snapshots: one step (--step N, logged as "
        "the metric step_score), or every step for the report's anytime curves (--all-steps or --every N, "
        "logged as the anytime.* metrics).",
    )
    p.add_argument("run_id", help="the MLflow run id (printed at the end of every run)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--step", type=int, help="the step whose workspace to score (1 = after the first)")
    which.add_argument("--all-steps", action="store_true", help="every step, for the anytime curves")
    which.add_argument("--every", type=int, metavar="N", help="every Nth step and the last, for the anytime curves")
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, else SQLite in --tracking-dir")
    p.add_argument("--tracking-dir", default="mlruns")
    p.add_argument("--cache-dir", default=None, help="the asset cache (default: the run's paths.cache_dir)")
    p.add_argument("--out", default="outputs/rescore", help="scratch folder for the rebuilt workspace and scoring")
    return p


@dataclass
class SnapshottedRun:
    """A finished run from the store, its snapshots and task at hand: any step can be scored."""

    client: Any
    run: Any
    local: Path  # this run's scratch folder
    config: dict
    snapshots: Path  # the downloaded `snapshots/` artifact
    task: Any
    asset_path: Path

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    def log(self, values: dict[str, float], step: int) -> None:
        """Log metric values at STEP to the store, and to the run folder's record when it is here."""
        from mlrb.store import record, tracking

        folder = self.run.data.tags.get(Tag.RUN_DIR)
        recorder = tracking.MlflowRunWriter(self.client, self.run_id, self.run.info.experiment_id)
        record.append_after(Path(folder) if folder else None, recorder, "metrics", metrics=values, step=step)

    def entries(self) -> list[dict]:
        """Each step's snapshot line, the task's read-only files left out (they are restored)."""
        from mlrb.run_files import snapshots

        globs = self.task.rules.read_only_globs(self.asset_path)
        return [snapshots.without(entry, globs) for entry in snapshots.load_steps(self.snapshots)]

    def score(self, entry: dict) -> Any:
        """Rebuild the step's workspace in its own folder and score its submission (a ScoreReport)."""
        from mlrb.core.config import SandboxConfig
        from mlrb.run_files import snapshots, workspace
        from mlrb.scoring.runner import ScorerError, score_submission

        folder = self.local / f"step-{entry['step']}"
        try:  # (linked to the store's objects: the submission is copied out of it before it is scored)
            work = snapshots.materialise(
                self.snapshots, entry, self.task.start.files(self.asset_path), folder / "workspace", link=True
            )
        except snapshots.MissingObject as e:
            where = self.run.data.tags.get(Tag.RUN_DIR) or "its run folder"
            raise ConfigError(
                f"step {entry['step']}: {e}: the tracking store holds only what record.snapshots "
                f"sent; rescore on the machine that holds {where}"
            ) from None
        submission = folder / "submission"
        shutil.rmtree(submission, ignore_errors=True)  # from an earlier rescoring of the same step
        if submission.is_file():
            submission.unlink()
        workspace.collect(work, self.task.rules.submission, submission)
        try:
            report = score_submission(
                self.task,
                submission,
                self.asset_path,
                folder / "scoring",
                SandboxConfig(**self.config["sandbox"]),
                self.run_id,
            )
        except ScorerError as e:
            raise ScoringFailed(f"step {entry['step']}: {e}") from None
        (folder / "score_report.json").write_text(json.dumps(report.to_dict(), indent=2, default=float))
        return report


def load(args: argparse.Namespace) -> SnapshottedRun:
    """The run, its config and snapshots downloaded, its task's assets found (built if need be)."""
    from omegaconf import OmegaConf

    from mlrb.core import registry
    from mlrb.core.config import TaskConfig
    from mlrb.harness import assets as assets_lib
    from mlrb.report.cli import ReportError, tracking_uri
    from mlrb.store import tracking

    try:
        client = tracking.reading_client(tracking_uri(args))
        run = client.get_run(args.run_id)
    except ReportError as e:
        raise ConfigError(str(e)) from None
    except Exception as e:  # MLflow's own error for an unknown run id
        raise ConfigError(f"no run {args.run_id} in the tracking store: {str(e).splitlines()[0][:200]}") from None
    local = Path(args.out).resolve() / args.run_id
    local.mkdir(parents=True, exist_ok=True)
    try:
        config_file = client.download_artifacts(args.run_id, "config.yaml", str(local))
        config = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.load(config_file)))
        root = kept_snapshots(run) or Path(client.download_artifacts(args.run_id, "snapshots", str(local)))
    except Exception:
        raise ConfigError(
            f"run {args.run_id} has no step snapshots (runs recorded before they were kept have none)"
        ) from None
    task_cfg = TaskConfig(**config["task"])
    task = registry.load_task(task_cfg)
    cache_dir = Path(args.cache_dir or config["paths"]["cache_dir"]).expanduser()
    asset_path, environment = assets_lib.prepare(task, cache_dir)
    task = in_environment(task, environment)
    if assets_lib.fingerprint(asset_path) != run.data.tags.get(Tag.ASSETS_FINGERPRINT):
        print(
            f"warning: the assets differ from the run's (fingerprint {assets_lib.fingerprint(asset_path)}, "
            f"run {run.data.tags.get(Tag.ASSETS_FINGERPRINT)})",
            file=sys.stderr,
        )
    return SnapshottedRun(client, run, local, config, root, task, asset_path)


def kept_snapshots(run: Any) -> Path | None:
    """The run folder's own snapshots, when that folder is on this machine: every content, large
    ones too, with nothing to download."""
    from mlrb.run_files import snapshots

    folder = run.data.tags.get(Tag.RUN_DIR)
    root = Path(folder) / "snapshots" if folder else None
    return root if root is not None and (root / snapshots.STEPS).is_file() else None


def rescore(args: argparse.Namespace) -> str:
    """--step N: score that step, log it as `step_score`."""
    loaded = load(args)
    entry = next((e for e in loaded.entries() if e["step"] == args.step), None)
    if entry is None:
        listed = ", ".join(str(e["step"]) for e in loaded.entries()) or "none"
        raise ConfigError(f"run {args.run_id} has no step {args.step}; its steps: {listed}")
    report = loaded.score(entry)
    name = loaded.run.info.run_name
    if report.valid and report.score is not None and math.isfinite(report.score):
        loaded.log({Metric.STEP_SCORE: report.score}, args.step)
        return f"{name} step {args.step}: score {report.score:.4f} (valid)"
    return f"{name} step {args.step}: no score (invalid: {report.reason})"


def chosen_steps(entries: list[dict], every: int | None) -> list[dict]:
    """Every step, or every Nth and the last (the run's final workspace is always scored)."""
    if every is None:
        return entries
    return [e for i, e in enumerate(entries) if e["step"] % every == 0 or i == len(entries) - 1]


def trajectory_lines(loaded: SnapshottedRun) -> list[dict]:
    """The run's trajectory (when each step ended, what it cost), or [] when it has none."""
    try:
        path = loaded.client.download_artifacts(loaded.run_id, "trajectory.jsonl", str(loaded.local))
    except Exception:
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def rescore_steps(args: argparse.Namespace, say: Callable[[str], None] = print) -> str:
    """--all-steps / --every N: score the steps, log the anytime metrics at each; says a line per step."""
    if args.every is not None and args.every < 1:
        raise ConfigError(f"--every takes a number of steps of 1 or more, not {args.every}")
    loaded = load(args)
    from mlrb.run_files import snapshots

    entries = loaded.entries()
    if not entries:
        raise ConfigError(f"run {args.run_id} has no step snapshots (its agent took no step)")
    trajectory = trajectory_lines(loaded)
    if not any(line.get("event") == "start" for line in trajectory):
        print(
            f"warning: run {args.run_id} has no trajectory with its start: its steps' wall times are unknown",
            file=sys.stderr,
        )
    ends = anytime.step_ends(trajectory, entries)
    metrics = loaded.run.data.metrics
    anchors = {name: metrics.get(name) for name in anytime.ANCHORS}
    task = loaded.task

    name = loaded.run.info.run_name
    chosen = chosen_steps(entries, args.every)
    say(f"{name}: scoring {len(chosen)} of its {len(entries)} steps' workspaces (run {args.run_id})")
    if entries[0]["step"] > 0:  # the starting files: doing nothing, by that anchor's definition
        start = anytime.step_metrics(False, None, anchors, task.higher_is_better, task.setup.normalisation, 0.0, 0.0)
        loaded.log(start, 0)
        say(line(0, start, "the starting files, no submission yet"))
    scored: dict[str, tuple[int, Any]] = {}  # a workspace's state -> the step that scored it, and its report
    for entry in chosen:
        step, key = entry["step"], snapshots.state_key(entry)
        if key in scored:
            first, report = scored[key]
            note = f"the same workspace as step {first}"
        else:
            report = loaded.score(entry)
            scored[key] = (step, report)
            note = ""
        score = report.score if report.score is not None and math.isfinite(report.score) else None
        wall, usd = ends[step]
        values = anytime.step_metrics(
            report.valid, score, anchors, task.higher_is_better, task.setup.normalisation, wall, usd
        )
        loaded.log(values, step)
        say(line(step, values, note or ("valid" if values[anytime.VALID] else f"invalid: {report.reason}")))
    return (
        f"logged the anytime metrics at {len(chosen) + (entries[0]['step'] > 0)} steps ({len(scored)} "
        f"workspaces scored); python -m mlrb.report draws them"
    )


def line(step: int, values: dict[str, float], note: str) -> str:
    """One step as the command prints it: when, at what cost, what it scored and counts as."""
    usd = values.get(anytime.USD)
    parts = [f"step {step}", duration(values.get(anytime.WALL_S)), "-" if usd is None else f"${usd:.4f}"]
    if anytime.SCORE in values:
        parts.append(f"score {values[anytime.SCORE]:.4g}")
    if anytime.COUNTED in values:
        parts.append(f"counted normalised {values[anytime.COUNTED]:.1f}")
    return ", ".join(parts) + f" ({note})"


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        if args.step is not None:
            print(rescore(args))
        else:
            print(rescore_steps(args, say=lambda text: print(text, flush=True)))
    except ConfigError as e:
        print(f"mlrb.rescore: error: {e}", file=sys.stderr)
        sys.exit(2)
    except ScoringFailed as e:
        print(f"mlrb.rescore: error: the scorer failed on {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
