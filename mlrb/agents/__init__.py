"""Agents: the model (or script) that decides what to do; actions go through the sandbox."""
