"""The names of the tags mlrb puts on MLflow runs, each spelt once.

The harness writes them (run.py, sweep.py, tracking.py, a task's checkpoint
selection); the report, rescoring and sweep resumption read them back. The
values are what stored runs carry: changing one would orphan every run recorded
before. How a run ended (the `STATUS` tag's values) is mlrb/status.py's.
"""

from __future__ import annotations

from typing import Final


class Tag:
    """Tag names, as `Tag.STATUS` (a namespace: many callers hold a dict named `tags`)."""

    # What the run is: set when it starts.
    TASK: Final = "mlrb.task"
    AGENT: Final = "mlrb.agent"
    BUDGET: Final = "mlrb.budget"
    SEED: Final = "mlrb.seed"
    SCALE: Final = "mlrb.scale"
    SANDBOX: Final = "mlrb.sandbox"
    CONFINED: Final = "mlrb.confined"  # "true" / "false": the report never pools the two
    NETWORK: Final = "mlrb.network"
    NORMALISED_AS: Final = "mlrb.normalised_as"
    RUN_KEY: Final = "mlrb.run_key"  # the same run of a sweep launched again has the same key
    RUN_DIR: Final = "mlrb.run_dir"
    SWEEP_ID: Final = "mlrb.sweep_id"
    ATTEMPT: Final = "mlrb.attempt"  # 1, then one more each time a resumed run starts again
    GIT_DIRTY: Final = "mlrb.git_dirty"
    ASSETS_FINGERPRINT: Final = "mlrb.assets_fingerprint"

    # How it ended.
    STATUS: Final = "mlrb.status"  # a mlrb.status.Status value
    ERROR: Final = "mlrb.error"
    STOP_REASON: Final = "mlrb.stop_reason"
    AGENT_MESSAGE: Final = "mlrb.agent_message"
    VALID: Final = "mlrb.valid"  # "True" / "False"
    INVALID_REASON: Final = "mlrb.invalid_reason"
    READ_ONLY_RESTORED: Final = "mlrb.read_only_restored"
    SCORED_STEP: Final = "mlrb.scored_step"  # which checkpoint a task's selection scored
    DEV_SCORES: Final = "mlrb.dev_scores"

    # A sweep's parent run: ROLE is SWEEP_ROLE on it (and absent on the runs).
    ROLE: Final = "mlrb.role"
    N_JOBS: Final = "mlrb.n_jobs"
    COMMAND: Final = "mlrb.command"

    # A model call's trace: the agent's step number.
    STEP: Final = "mlrb.step"

    # MLflow's own tags that mlrb sets or reads.
    PARENT_RUN_ID: Final = "mlflow.parentRunId"
    GIT_COMMIT: Final = "mlflow.source.git.commit"
    NOTE: Final = "mlflow.note.content"


SWEEP_ROLE: Final = "sweep"
