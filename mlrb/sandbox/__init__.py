"""Where an agent's actions execute. `Sandbox` is the whole interface: bwrap (the default),
Docker, or none, each with the run's GPUs, limits and model bridge. Imports mlrb.core."""

from mlrb.sandbox.base import ExecResult, Sandbox

__all__ = ["ExecResult", "Sandbox"]
