"""Agents: the model (or script) that decides what to do; actions go through the sandbox. The
built-in loop (llm, conversation, tools), installed programs (Claude Code, Codex),
your own command, a person, and the scripted baseline. Their model calls go through mlrb.models
(providers, prices, the metering proxy). Imports mlrb.tasks, mlrb.sandbox, mlrb.run_files,
mlrb.store, mlrb.models and mlrb.core; never the harness that runs them, nor the commands."""
