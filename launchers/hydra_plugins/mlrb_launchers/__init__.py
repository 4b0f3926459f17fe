"""Hydra takes launchers only from the `hydra_plugins` namespace: these subclasses
put mlrb's sweep launchers there (their code lives in mlrb/sweep.py)."""

from mlrb import sweep


class LocalSweepLauncher(sweep.LocalSweepLauncher):
    """Sweep jobs as local processes through submitit, a capped number at once."""


class SlurmSweepLauncher(sweep.SlurmSweepLauncher):
    """Sweep jobs as SLURM job arrays through submitit."""
