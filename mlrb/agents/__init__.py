"""Agents: the model (or script) that decides what to do; actions go through the sandbox. The
built-in loop (llm, conversation, tools, providers), installed programs (Claude Code, Codex),
your own command, a person, the scripted baseline, and model prices. Imports mlrb.harness,
mlrb.sandbox, mlrb.tasks, mlrb.store and mlrb.core, never the commands that run them."""
