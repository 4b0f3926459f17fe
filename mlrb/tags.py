"""The names of the tags mlrb puts on MLflow runs, each spelt once.

The harness writes them (run.py, sweep.py, tracking.py, a task's checkpoint
selection); the report, rescoring and sweep resumption read them back. The
values are what stored runs carry: changing one would orphan every run recorded
before. How a run ended (the `STATUS` tag's values) is mlrb/status.py's.
"""


class Tag:
    """Tag names, as `Tag.STATUS` (a namespace: many callers hold a dict named `tags`).
    Grouped by when they are set, a group a line."""

    # What the run is, set when it starts; CONFINED is "true" or "false" (the report never
    # pools the two); RUN_KEY is the same for a sweep's job launched again.
    TASK, AGENT, BUDGET, SEED, SCALE = "mlrb.task", "mlrb.agent", "mlrb.budget", "mlrb.seed", "mlrb.scale"
    SANDBOX, CONFINED, NETWORK = "mlrb.sandbox", "mlrb.confined", "mlrb.network"
    NORMALISED_AS, RUN_KEY, RUN_DIR, SWEEP_ID = "mlrb.normalised_as", "mlrb.run_key", "mlrb.run_dir", "mlrb.sweep_id"
    # 1, then one more each time a resumed run starts again; the code and assets it ran on.
    ATTEMPT, GIT_DIRTY, ASSETS_FINGERPRINT = "mlrb.attempt", "mlrb.git_dirty", "mlrb.assets_fingerprint"
    # How an attempt that did not end the run ended (say, its job requeued): the next attempt says why it resumed.
    ATTEMPT_ENDED = "mlrb.attempt_ended"
    # The Python environment the agent ran in: "harness", or the task's own's key (mlrb/environments.py).
    ENVIRONMENT = "mlrb.environment"
    # The ids of the rules the scale states but nothing enforces (comma-separated; "": none).
    UNENFORCED_RULES = "mlrb.unenforced_rules"
    # "true" on a run at a plumbing scale (the task's `plumbing`): it checks the harness and
    # measures nothing, so the report's means and mlrb.compare leave it out.
    PLUMBING = "mlrb.plumbing"

    # How it ended: STATUS is a mlrb.status.Status value, VALID "True" or "False".
    STATUS, ERROR, STOP_REASON = "mlrb.status", "mlrb.error", "mlrb.stop_reason"
    VALID, INVALID_REASON, AGENT_MESSAGE = "mlrb.valid", "mlrb.invalid_reason", "mlrb.agent_message"
    READ_ONLY_RESTORED = "mlrb.read_only_restored"
    # The models the agent's calls named, comma-separated (the metering proxy served only allowed ones).
    MODELS_USED = "mlrb.models_used"
    # How it counts in means (mlrb/counting.py): "score", "do_nothing" or "none", and why.
    COUNTED_AS, COUNTED_REASON = "mlrb.counted_as", "mlrb.counted_reason"
    # Which checkpoint a task's own selection scored, and the dev scores it chose by.
    SCORED_STEP, DEV_SCORES = "mlrb.scored_step", "mlrb.dev_scores"

    # A sweep's parent run: ROLE is SWEEP_ROLE on it (and absent on the runs).
    ROLE, N_JOBS, COMMAND = "mlrb.role", "mlrb.n_jobs", "mlrb.command"

    # A model call's trace: the agent's step number.
    STEP = "mlrb.step"

    # MLflow's own tags that mlrb sets or reads.
    PARENT_RUN_ID, GIT_COMMIT, NOTE = "mlflow.parentRunId", "mlflow.source.git.commit", "mlflow.note.content"


SWEEP_ROLE = "sweep"
