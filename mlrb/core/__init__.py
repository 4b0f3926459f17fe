"""What every layer shares, and imports nothing of mlrb's outside this folder: the config's schema
and the names it may use (config, registry, task_configs, run_names), the names of tags and
metrics (tags), the vocabulary of a run's end (status), its events and budget (events, budget,
timeline), what mlrb says and logs (messages, console), signals (interrupts), retry policies
(retries), and imports kept out of the garbage collector's passes (collector)."""
