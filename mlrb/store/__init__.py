"""The run's record and the tracking store it goes to: the run folder's record.jsonl (record),
its export to MLflow by a process beside the harness (recording_process, and recording_server,
which forks those processes for a local sweep), the MLflow side of a run (tracking), the
traces' format (tracing), the runs table's view (experiment_view) and a lab's tracking server
(tracking_server). Imports mlrb.core only; nothing here runs an agent or a task."""
