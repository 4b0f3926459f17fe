"""Agents: the model (or script) that decides what to do; actions go through the sandbox. The
built-in loop (llm, conversation, tools), installed programs (Claude Code, Codex),
your own command, a person, and the scripted baseline. Their model calls go through mlrb.models
(providers, prices, the metering proxy). Imports mlrb.harness, mlrb.models,
mlrb.sandbox, mlrb.tasks, mlrb.store and mlrb.core, never the commands that run them."""
