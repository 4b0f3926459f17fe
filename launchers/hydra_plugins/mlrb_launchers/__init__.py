"""Hydra takes launchers and sweepers only from the `hydra_plugins` namespace: these subclasses
put mlrb's sweep launchers and sweeper there (their code lives in mlrb/sweep.py)."""

from mlrb import sweep


class LocalSweepLauncher(sweep.LocalSweepLauncher):
    """Sweep jobs as local processes through submitit, a capped number at once."""


class SlurmSweepLauncher(sweep.SlurmSweepLauncher):
    """Sweep jobs as SLURM job arrays through submitit."""


class BasicSweeper(sweep.Sweeper):
    """Hydra's basic sweeper, which leaves the jobs' configs to mlrb's checks and launchers."""
