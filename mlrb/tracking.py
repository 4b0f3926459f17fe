"""Record a run in MLflow: where the store is, and one small recorder per run.

mlflow is imported lazily (it is slow to import); all calls go through an
explicit MlflowClient and run id, so no global "active run" state is involved.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from mlrb.config import TrackingConfig

BATCH = 100  # MLflow accepts at most 100 params or tags per log_batch call
SECRET_KEY = re.compile(r"(api_?key|secret|password|passwd|auth_token|access_token|bearer)$", re.IGNORECASE)


def store_location(cfg: TrackingConfig) -> Tuple[str, Optional[str]]:
    """(tracking URI, artifact root for new experiments or None for the server's default)."""
    uri = cfg.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri, None
    root = Path(cfg.dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}", (root / "artifacts").as_uri()


def flatten(tree: Any, prefix: str = "") -> Dict[str, str]:
    flat: Dict[str, str] = {}
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            flat.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(tree, (list, tuple)) and any(isinstance(v, (Mapping, list, tuple)) for v in tree):
        for i, value in enumerate(tree):
            flat.update(flatten(value, f"{prefix}{i}."))
    else:
        flat[prefix[:-1]] = redact(prefix[:-1], tree)
    return flat


def redact(key: str, value: Any) -> str:
    if value is not None and SECRET_KEY.search(key.rsplit(".", 1)[-1]):
        return "***"
    return str(value)


def harness_commit() -> Dict[str, str]:
    """The git commit of the harness's own code, when it runs from a checkout."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return {}
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return {"mlflow.source.git.commit": commit.stdout.strip(), "mlrb.git_dirty": str(bool(dirty.stdout.strip()))}
    except (OSError, subprocess.SubprocessError):
        return {}


def chunks(items: list, size: int = BATCH) -> Iterable[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class RunRecorder:
    """One MLflow run. Create with `open_run`; always end with `finish`."""

    def __init__(self, client: Any, run_id: str, experiment_id: str):
        self.client = client
        self.run_id = run_id
        self.experiment_id = experiment_id

    def log_params(self, params: Dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v[:6000]) for k, v in sorted(params.items())]
        for batch in chunks(items):
            self.client.log_batch(self.run_id, params=batch)

    def set_tags(self, tags: Dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)) for k, v in tags.items()]
        for batch in chunks(items):
            self.client.log_batch(self.run_id, tags=batch)

    def log_metrics(self, metrics: Dict[str, float], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None]
        for batch in chunks(items, 1000):
            self.client.log_batch(self.run_id, metrics=batch)

    def log_text(self, text: str, name: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def log_file(self, path: Path, folder: Optional[str] = None) -> None:
        if Path(path).exists():
            self.client.log_artifact(self.run_id, str(path), folder)

    def finish(self, status: str) -> None:
        """status: FINISHED, FAILED or KILLED."""
        self.client.set_terminated(self.run_id, status)


def open_run(cfg: TrackingConfig, experiment: str, run_name: str, tags: Dict[str, Any]) -> RunRecorder:
    from mlflow.tracking import MlflowClient

    uri, artifact_root = store_location(cfg)
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        experiment_id = found.experiment_id
    else:
        try:
            location = f"{artifact_root}/{re.sub(r'[^A-Za-z0-9_.-]', '_', experiment)}" if artifact_root else None
            experiment_id = client.create_experiment(experiment, artifact_location=location)
        except Exception:
            # Another run of the same sweep created it first.
            found = client.get_experiment_by_name(experiment)
            if found is None:
                raise
            experiment_id = found.experiment_id
    run = client.create_run(experiment_id, run_name=run_name, tags={k: str(v) for k, v in tags.items()})
    return RunRecorder(client, run.info.run_id, experiment_id)
