"""The compiled bytecode of what mlrb's processes import, written once at install:
`python -m mlrb.core.bytecode` (install.sh runs it).

pip compiles every module it installs unless told not to: about 110 CPU seconds for mlrb's
libraries on 2 cores, most of it for modules no run imports (transformers' hundreds of model
families, torch's compiler and test helpers). install.sh installs without compiling (uv's default;
pip's `--no-compile`) and then compiles what the runs import: the harness's, its recording
process's, the scorer's and the tasks' starter scripts' libraries: install.sh then took about 70
CPU s less here (173 to 104). A scorer or an agent's script runs in a sandbox that mounts the
environment read-only, where a module without its bytecode would be compiled again at every
import; any module not named here is compiled where it is first imported outside a sandbox, once.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import py_compile
import sys
from collections.abc import Iterable

# What the runs' processes import (tests/test_bytecode.py checks that the scorers' and starter
# scripts' imports are here): the harness and its recording process, the agents' SDKs, the scorers
# (lm-eval and the metrics), the tiny tasks' model families, and the starters' libraries.
RUN_IMPORTS = (
    "hydra",
    "omegaconf",
    "submitit",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "anthropic",
    "openai",
    "numpy",
    "torch",
    "safetensors.torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.llama.modeling_llama",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.bart.modeling_bart",
    "transformers.models.phi.modeling_phi",
    "peft",
    "peft.utils",
    "datasets",
    "lm_eval.evaluator",
    "lm_eval.tasks",
    "lm_eval.models.huggingface",
    "sacrebleu.metrics",
    "rouge_score.rouge_scorer",
)
# The harness's side of them (its recording process, the agents' SDKs); the rest is the models'
# side (torch, transformers, the scorers). Each side is about half the compiling, and they share
# few modules, so the two are compiled at once, a process each: an install's compile took 20 s
# instead of 35 on 2 cores here, for the same CPU time.
HARNESS_SIDE = ("hydra", "omegaconf", "submitit", "mlflow", "anthropic", "openai")


def compile_imports(modules: Iterable[str]) -> int:
    """Import MODULES and write the bytecode of every module that loaded from source without it
    (whatever PYTHONDONTWRITEBYTECODE says). Returns how many were written."""
    for name in modules:
        importlib.import_module(name)
    written = 0
    for module in list(sys.modules.values()):
        source = getattr(module, "__file__", None)
        if not source or not source.endswith(".py") or not os.path.exists(source):
            continue
        cached = importlib.util.cache_from_source(source)
        if os.path.exists(cached):
            continue
        try:
            py_compile.compile(source, cfile=cached, doraise=True)
            written += 1
        except (OSError, py_compile.PyCompileError):
            continue  # a read-only or odd file: it is compiled where it is imported, as before
    return written


def sides(modules: Iterable[str]) -> list[list[str]]:
    """MODULES as the harness's side and the models' side (HARNESS_SIDE)."""
    modules = list(modules)
    harness = [name for name in modules if name.split(".")[0] in HARNESS_SIDE]
    return [harness, [name for name in modules if name not in harness]]


def compile_side_by_side(modules: Iterable[str]) -> int:
    """compile_imports of each side of MODULES, at once, in processes forked before either is
    imported. Returns how many were written (a module both sides import may count twice: the
    second write replaces the first whole)."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(2) as pool:
        return sum(pool.map(compile_imports, sides(modules)))


if __name__ == "__main__":
    print(f"compiled {compile_side_by_side(RUN_IMPORTS)} modules that runs import")
