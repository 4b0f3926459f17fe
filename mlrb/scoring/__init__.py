"""Scoring a submission in a process of its own: the runner that starts it in a sandbox, the
worker that runs a task's scorer there, lm-eval's evaluation, the score report every scorer
returns and the command that submits. Imports mlrb.sandbox and mlrb.core; never the tasks
(they import its helpers)."""
