"""Score any step of a finished run, as MLAgentBench allows:

    python -m mlrb.rescore RUN_ID --step N [--tracking-dir mlruns | --tracking-uri URI]

The run's step snapshots (artifact `snapshots/`) rebuild the workspace as it was after
step N; the task's read-only files are restored, and the submission is scored as the
run's own was (same task config, same kind of scoring sandbox, the cached assets).
The score is printed and logged to the run as the metric `step_score` at step N.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, cast

from mlrb.config import ConfigError
from mlrb.tags import Tag


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mlrb.rescore", description="Score one step of a finished mlrb run.")
    p.add_argument("run_id", help="the MLflow run id (printed at the end of every run)")
    p.add_argument("--step", type=int, required=True, help="the step whose workspace to score (1 = after the first)")
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, else SQLite in --tracking-dir")
    p.add_argument("--tracking-dir", default="mlruns")
    p.add_argument("--cache-dir", default=None, help="the asset cache (default: the run's paths.cache_dir)")
    p.add_argument("--out", default="outputs/rescore", help="scratch folder for the rebuilt workspace and scoring")
    return p


def rescore(args: argparse.Namespace) -> str:
    from omegaconf import OmegaConf

    from mlrb import assets as assets_lib
    from mlrb import registry, snapshots, workspace
    from mlrb.config import SandboxConfig, TaskConfig
    from mlrb.report.cli import ReportError, connect, tracking_uri
    from mlrb.scoring.runner import score_submission

    try:
        client = connect(tracking_uri(args))
        run = client.get_run(args.run_id)
    except ReportError as e:
        raise ConfigError(str(e)) from None
    except Exception as e:  # MLflow's own error for an unknown run id
        raise ConfigError(f"no run {args.run_id} in the tracking store: {str(e).splitlines()[0][:200]}") from None
    local = Path(args.out).resolve() / args.run_id / f"step-{args.step}"
    local.mkdir(parents=True, exist_ok=True)
    try:
        config_file = client.download_artifacts(args.run_id, "config.yaml", str(local))
        config = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.load(config_file)))
        root = Path(client.download_artifacts(args.run_id, "snapshots", str(local)))
    except Exception:
        raise ConfigError(
            f"run {args.run_id} has no step snapshots (runs recorded before they were kept have none)"
        ) from None
    entry = snapshots.find_step(root, args.step)
    if entry is None:
        steps = [e["step"] for e in snapshots.load_steps(root)]
        listed = ", ".join(map(str, steps)) or "none"
        raise ConfigError(f"run {args.run_id} has no step {args.step}; its steps: {listed}")

    task_cfg = TaskConfig(**config["task"])
    task = registry.task_class(task_cfg)(task_cfg)
    cache_dir = Path(args.cache_dir or config["paths"]["cache_dir"]).expanduser()
    asset_path = assets_lib.ensure_assets(task, cache_dir)
    if assets_lib.fingerprint(asset_path) != run.data.tags.get(Tag.ASSETS_FINGERPRINT):
        print(f"warning: the assets differ from the run's (fingerprint {assets_lib.fingerprint(asset_path)}, "
              f"run {run.data.tags.get(Tag.ASSETS_FINGERPRINT)})", file=sys.stderr)  # fmt: skip
    entry = snapshots.without(entry, task.read_only_globs(asset_path))
    work = snapshots.materialise(root, entry, task.workspace_files(asset_path), local / "workspace")
    submission = local / "submission"
    workspace.collect(work, task_cfg.submission, submission)
    report = score_submission(task, submission, asset_path, local / "scoring", SandboxConfig(**config["sandbox"]),
                              args.run_id)  # fmt: skip
    (local / "score_report.json").write_text(json.dumps(report.to_dict(), indent=2, default=float))
    if report.valid and report.score is not None and math.isfinite(report.score):
        client.log_metric(args.run_id, "step_score", report.score, step=args.step)
        return f"{run.info.run_name} step {args.step}: score {report.score:.4f} (valid)"
    return f"{run.info.run_name} step {args.step}: no score (invalid: {report.reason})"


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        print(rescore(args))
    except ConfigError as e:
        print(f"mlrb.rescore: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
