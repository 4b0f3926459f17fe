"""The tasks: one folder each (its config, page, starter files and code), and what every task is
made of (base: the frozen `Task`, what its competition defines, and its parts: attempt_rules,
builder, anchors, judge, solutions; model_checks: the checks of a submitted model folder), with
what mlrb does with a task (handling: its assets' key and build, a run's anchors). A task never
imports the harness that builds and scores it (mlrb.harness, mlrb.scoring.runner): it is handed
what it needs. Imports mlrb.task_kit (what tasks are built with), mlrb.scoring's helpers,
mlrb.sandbox, mlrb.run_files (a task folder picks its step from the run's snapshots),
mlrb.analysis and mlrb.core."""
