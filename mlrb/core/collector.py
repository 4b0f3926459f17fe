"""Imports that last as long as the process, kept out of Python's cyclic garbage collector.

The collector goes through every object a process holds: several times while torch,
transformers or MLflow are imported (each pass longer as the heap grows), then at intervals
while the process works, through the libraries' objects again. A process that imports them and
then works on (the scorer, a run's recording process, a sweep's recording server) makes those
imports inside `lasting_imports()`: the collector is off meanwhile, and what the process holds
when the block ends is frozen (`gc.freeze`), so that its later collections go through what it
makes afterwards only, and a fork of it leaves the pages it shares with its parent unwritten.
The collector is on again afterwards, whatever the block raised.

    with lasting_imports():
        import mlflow
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def lasting_imports() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
