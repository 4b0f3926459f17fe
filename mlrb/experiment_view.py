"""Experiments that the MLflow UI opens on the runs table.

MLflow 3's UI picks an experiment's first page from its `mlflow.experimentKind` tag;
without the tag it guesses, and an experiment with traces (LLM agents log them)
opens on the GenAI overview instead of the runs. mlrb's experiments are model
development: say so explicitly.
"""

from __future__ import annotations

from typing import Any

KIND_TAG = "mlflow.experimentKind"
RUNS_TABLE_KIND = "custom_model_development"
# For client.create_experiment(..., tags=EXPERIMENT_TAGS).
EXPERIMENT_TAGS = {KIND_TAG: RUNS_TABLE_KIND}


def open_on_runs_table(client: Any, experiment_id: str) -> None:
    """Tag an experiment made before mlrb set the kind (a user's own choice of kind is kept)."""
    from mlrb.retries import with_retries

    experiment = with_retries(lambda: client.get_experiment(experiment_id))
    if KIND_TAG not in experiment.tags:
        with_retries(lambda: client.set_experiment_tag(experiment_id, KIND_TAG, RUNS_TABLE_KIND))
