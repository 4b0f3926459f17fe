"""Where an agent's actions execute. `Sandbox` is the whole interface."""

from mlrb.sandbox.base import ExecResult, Sandbox

__all__ = ["ExecResult", "Sandbox"]
