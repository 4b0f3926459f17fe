"""The names of the tags and metrics mlrb puts on MLflow runs, each spelt once.

The harness writes them (run.py, sweep.py, tracking.py, a task's checkpoint
selection); the report, rescoring and sweep resumption read them back. The
values are what stored runs carry: changing one would orphan every run recorded
before. How a run ended (the `STATUS` tag's values) is mlrb/core/status.py's.
"""


class Tag:
    """Tag names, as `Tag.STATUS` (a namespace: many callers hold a dict named `tags`).
    Grouped by when they are set, a group a line."""

    # What the run is, set when it starts; CONFINED is "true" or "false" (the report never
    # pools the two); RUN_KEY is the same for a sweep's job launched again.
    TASK, AGENT, BUDGET, SEED, SCALE = "mlrb.task", "mlrb.agent", "mlrb.budget", "mlrb.seed", "mlrb.scale"
    SANDBOX, CONFINED, NETWORK = "mlrb.sandbox", "mlrb.confined", "mlrb.network"
    NORMALISED_AS, RUN_KEY, RUN_DIR, SWEEP_ID = "mlrb.normalised_as", "mlrb.run_key", "mlrb.run_dir", "mlrb.sweep_id"
    # The run's own id, made by the harness as the run starts (its record's): the store's run is found by it.
    RUN_ID = "mlrb.run_id"
    # 1, then one more each time a resumed run starts again; the code and assets it ran on.
    ATTEMPT, GIT_DIRTY, ASSETS_FINGERPRINT = "mlrb.attempt", "mlrb.git_dirty", "mlrb.assets_fingerprint"
    # How an attempt that did not end the run ended (say, its job requeued): the next attempt says why it resumed.
    ATTEMPT_ENDED = "mlrb.attempt_ended"
    # The Python environment the agent ran in: "harness", or the task's own's key (mlrb/harness/environments.py).
    ENVIRONMENT = "mlrb.environment"
    # The ids of the rules the scale states but nothing enforces (comma-separated; "": none).
    UNENFORCED_RULES = "mlrb.unenforced_rules"
    # "true" on a run at a plumbing scale (the task's `plumbing`): it checks the harness and
    # measures nothing, so the report's means and mlrb.compare leave it out.
    PLUMBING = "mlrb.plumbing"

    # How it ended: STATUS is a mlrb.core.status.Status value, VALID "True" or "False".
    STATUS, ERROR, STOP_REASON = "mlrb.status", "mlrb.error", "mlrb.stop_reason"
    VALID, INVALID_REASON, AGENT_MESSAGE = "mlrb.valid", "mlrb.invalid_reason", "mlrb.agent_message"
    READ_ONLY_RESTORED = "mlrb.read_only_restored"
    # The models the agent's calls named, comma-separated (the metering proxy served only allowed ones).
    MODELS_USED = "mlrb.models_used"
    # How it counts in means (mlrb/analysis/counting.py): "score", "do_nothing" or "none", and why.
    COUNTED_AS, COUNTED_REASON = "mlrb.counted_as", "mlrb.counted_reason"
    # Which checkpoint a task's own selection scored, and the dev scores it chose by.
    SCORED_STEP, DEV_SCORES = "mlrb.scored_step", "mlrb.dev_scores"
    # A Harbor task's runs, from its tests: "true" when its verifier runs code the agent wrote, which could
    # write the reward itself (mlrb/tasks/harbor/verifier.py's `forgeable`), and why; else "false" and "".
    FORGEABLE_REWARD, FORGEABLE_REASON = "mlrb.forgeable_reward", "mlrb.forgeable_reason"
    # A task of steps (a Harbor task's [[steps]]) that ended before its last: why (a step's reward under its
    # min_reward, a step's verifier that gave none, the budget); "" when it ran them all.
    STEPS_ENDED_EARLY = "mlrb.steps_ended_early"
    # The run's review (mlrb/review/): its verdict ("clean", "suspicious", "tampering"; "error" when the
    # review itself failed) and how many findings its review.json lists.
    REVIEW, REVIEW_FINDINGS = "mlrb.review", "mlrb.review_findings"
    # How its model judge's read went, when one was asked for (review.judge): "ok", "incomplete" or "error".
    REVIEW_JUDGE = "mlrb.review_judge"

    # A sweep's parent run: ROLE is SWEEP_ROLE on it (and absent on the runs).
    ROLE, N_JOBS, COMMAND = "mlrb.role", "mlrb.n_jobs", "mlrb.command"

    # A model call's trace: the agent's step number.
    STEP = "mlrb.step"
    # The run id a run synced before the harness made its own ids had in its record (now: RUN_ID).
    SYNCED_FROM = "mlrb.synced_from"
    # Set by mlrb.sync once the store's run holds all of its record: a digest of the record (mlrb/sync.py).
    SYNCED_RECORD = "mlrb.synced_record"

    # MLflow's own tags that mlrb sets or reads.
    PARENT_RUN_ID, GIT_COMMIT, NOTE = "mlflow.parentRunId", "mlflow.source.git.commit", "mlflow.note.content"


SWEEP_ROLE = "sweep"


class Metric:
    """Metric names, as `Metric.SCORE` (a namespace, as `Tag`): what the harness logs on a run and
    the report, comparison, rescoring and sweep summary read back. The values are what stored runs
    carry: changing one would orphan every run recorded before. A task's own metrics (its
    ScoreReport's `metrics`, say `bleu`) are its own; tests/test_one_place.py holds mlrb/ to these."""

    # The score and how it counts (mlrb/analysis/counting.py's run_metrics): VALID and SUCCESS are 1.0 or 0.0.
    VALID, SCORE, NORMALISED_SCORE = "valid", "score", "normalised_score"
    COUNTED_SCORE, COUNTED_NORMALISED_SCORE = "counted_score", "counted_normalised_score"
    IMPROVEMENT, SUCCESS = "improvement", "success"
    # The task's anchors, by the names its anchors file gives them too (mlrb/tasks/anchors.py), and the
    # SEM over their seeds of the measured ones.
    DO_NOTHING_SCORE, BASELINE_SCORE, REFERENCE_SCORE = "do_nothing_score", "baseline_score", "reference_score"
    ANCHORS = (DO_NOTHING_SCORE, BASELINE_SCORE, REFERENCE_SCORE)  # what normalises a score and counts it
    BASELINE_SCORE_SEM, REFERENCE_SCORE_SEM = "baseline_score_sem", "reference_score_sem"

    # What the agent spent (mlrb/core/budget.py's summary), kept across a resumed run's attempts.
    STEPS, INPUT_TOKENS, OUTPUT_TOKENS = "steps", "input_tokens", "output_tokens"
    # Of the input tokens: those read from the provider's prompt cache, and those written to it.
    CACHE_READ_TOKENS, CACHE_WRITE_TOKENS = "cache_read_tokens", "cache_write_tokens"
    # What the provider billed beside tokens: its web searches, and the dollars of such fees (within COST_USD).
    WEB_SEARCHES, FEE_USD = "web_searches", "fee_usd"
    COST_USD, AGENT_TIME_S = "cost_usd", "agent_time_s"
    # The hardware the agent's sandbox held (mlrb/core/compute.py): GPU-hours, CPU-hours (cores), and their
    # dollars at the config's prices (COMPUTE_USD, only where a price is set; not within COST_USD, the API's).
    GPU_HOURS, CPU_HOURS, COMPUTE_USD = "gpu_hours", "cpu_hours", "compute_usd"
    SPENT = (
        STEPS,
        INPUT_TOKENS,
        OUTPUT_TOKENS,
        CACHE_READ_TOKENS,
        CACHE_WRITE_TOKENS,
        WEB_SEARCHES,
        FEE_USD,
        COST_USD,
        AGENT_TIME_S,
        GPU_HOURS,
        CPU_HOURS,
    )
    # What the review's model judge used and cost (review.judge): its own, never within COST_USD, the agent's.
    REVIEW_JUDGE_COST_USD = "review_judge_cost_usd"
    REVIEW_JUDGE_INPUT_TOKENS, REVIEW_JUDGE_OUTPUT_TOKENS = "review_judge_input_tokens", "review_judge_output_tokens"
    REVIEW_JUDGE_SPENT = (REVIEW_JUDGE_COST_USD, REVIEW_JUDGE_INPUT_TOKENS, REVIEW_JUDGE_OUTPUT_TOKENS)
    # The run's own times; STAGE_TIME_S is a prefix, + a stage's name (mlrb/core/timeline.py).
    PREPARE_TIME_S, SCORE_TIME_S, WALL_TIME_S = "prepare_time_s", "score_time_s", "wall_time_s"
    STAGE_TIME_S = "stage_time_s."

    # At each step of the agent (mlrb/agents/recording.py): a model call's latency, the run's totals after it.
    LLM_LATENCY_S, LLM_INPUT_TOKENS = "llm.latency_s", "llm.input_tokens"
    LLM_OUTPUT_TOKENS, LLM_COST_USD = "llm.output_tokens", "llm.cost_usd"
    # A step's workspace scored afterwards (`python -m mlrb.rescore RUN_ID --step N`).
    STEP_SCORE = "step_score"
    # A task of steps: each step's reward, at the step's number (1, 2, ...), and how many steps were scored.
    TASK_STEP_REWARD, TASK_STEPS_SCORED = "task_step_reward", "task_steps_scored"
    # The anytime metrics at each scored step (mlrb/analysis/anytime.py says what each holds).
    ANYTIME_VALID, ANYTIME_SCORE = "anytime.valid", "anytime.score"
    ANYTIME_NORMALISED, ANYTIME_COUNTED = "anytime.normalised_score", "anytime.counted_normalised_score"
    ANYTIME_WALL_S, ANYTIME_USD = "anytime.wall_s", "anytime.usd"

    # A sweep's parent run: its jobs, and what the whole sweep cost (mlrb/sweep_summary.py adds each
    # configuration's aggregates, prefixed).
    JOBS, JOBS_SKIPPED, JOBS_FAILED, JOBS_DONE = "jobs", "jobs_skipped", "jobs_failed", "jobs_done"
    COST_USD_TOTAL = "cost_usd_total"
    # and what its runs' hardware held and cost (where they recorded it)
    GPU_HOURS_TOTAL, CPU_HOURS_TOTAL, COMPUTE_USD_TOTAL = "gpu_hours_total", "cpu_hours_total", "compute_usd_total"
