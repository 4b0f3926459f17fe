"""Experiments marked as model development, for the MLflow UI's runs table.

The `mlflow.experimentKind` tag says what an experiment is; MLflow UIs that read it
open such an experiment on its runs table rather than guessing (an experiment with
traces, which LLM agents log, would be guessed GenAI). MLflow 3.17's UI does not read
it: its sidebar switch (GenAI / Model training, remembered by the browser, GenAI at
first) or an address's `?workflowType=machine_learning` decides, so the addresses mlrb
prints carry that parameter (mlrb/sweep_summary.py) and docs/sweeps.md says where the
switch is. tests/test_mlflow_ui.py checks both in a browser.
"""

from __future__ import annotations

from typing import Any

KIND_TAG = "mlflow.experimentKind"
RUNS_TABLE_KIND = "custom_model_development"
# For client.create_experiment(..., tags=EXPERIMENT_TAGS).
EXPERIMENT_TAGS = {KIND_TAG: RUNS_TABLE_KIND}


def open_on_runs_table(client: Any, experiment_id: str) -> None:
    """Tag an experiment made before mlrb set the kind (a user's own choice of kind is kept)."""
    from mlrb.core.retries import with_retries

    experiment = with_retries(lambda: client.get_experiment(experiment_id))
    if KIND_TAG not in experiment.tags:
        with_retries(lambda: client.set_experiment_tag(experiment_id, KIND_TAG, RUNS_TABLE_KIND))
