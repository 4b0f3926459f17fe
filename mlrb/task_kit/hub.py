"""What full-scale tasks take from the Hugging Face hub, and how they take it.

Everything goes through the user's Hugging Face cache (`HF_HOME`, `HF_HUB_CACHE`,
`HF_DATASETS_CACHE`): `python -m mlrb.prefetch` fills it on a machine with internet; a
run reads it, offline or not, and copies what the agent may see into its assets. So a
compute node without internet runs from what was prefetched.

`HubItem` names one thing (a model repository, or a dataset config); mlrb.tasks.handling's
`hub_needs` lists them for a task at its scale. Nothing here imports torch; huggingface_hub,
datasets and lm_eval are imported where used.
"""

from __future__ import annotations

import fnmatch
import functools
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_CONFIG = "default"  # the name `datasets` gives a dataset's only, unnamed config

# Files of a model repository a run uses (weights as safetensors; no pickles, no other formats).
MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.py"]
TOKENIZER_FILES = [
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "tokenizer.model",
]


@dataclass(frozen=True)
class HubItem:
    kind: str  # "model" or "dataset"
    repo: str
    config: str | None = None  # datasets: the config name (None: the only one)
    files: tuple | None = None  # models: file patterns to fetch (None: MODEL_FILES)
    why: str = ""  # which config key or evaluation names it

    def describe(self) -> str:
        config = f" (config {self.config})" if self.config else ""
        return f"{self.kind} {self.repo}{config}" + (f", for {self.why}" if self.why else "")


def lm_eval_datasets(tasks: Sequence[str]) -> dict[str, dict[str, list[str]]]:
    """{dataset_path: {dataset_name (or "default"): [splits lm-eval reads]}} for lm-eval task,
    group or tag names, read from lm-eval's own task definitions (without loading any data)."""
    if not tasks:
        return {}
    import hashlib
    import json
    import os
    from importlib.metadata import version

    # Indexing lm-eval's task library takes seconds; the answer depends only on its version.
    key = hashlib.sha256(json.dumps(sorted(tasks)).encode()).hexdigest()[:16]
    cache_root = Path(os.environ.get("MLRB_CACHE_DIR") or "~/.cache/mlrb").expanduser()
    cached = cache_root / "lm_eval_datasets" / f"lm_eval-{version('lm_eval')}-{key}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    found = _lm_eval_datasets(tasks)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(found, indent=1))
    partial.replace(cached)  # whole or not at all, for concurrent runs
    return found


def _lm_eval_datasets(tasks: Sequence[str]) -> dict[str, dict[str, list[str]]]:
    index = _lm_eval_index()
    found: dict[str, dict[str, list[str]]] = {}

    def visit(name: str) -> None:
        entry = index.get(name)
        if entry is None:
            raise KeyError(f"lm-eval has no task, group or tag named '{name}'")
        kind = entry.kind.name
        cfg = entry.cfg or {}
        if kind == "GROUP":
            for child in cfg.get("task", []):
                visit(child if isinstance(child, str) else child["task"])
        elif kind == "TAG":
            for member in sorted(entry.tags):
                visit(member)
        else:
            if not cfg.get("dataset_path"):
                return
            splits = [
                cfg[k] for k in ("training_split", "validation_split", "test_split", "fewshot_split") if cfg.get(k)
            ]
            configs = found.setdefault(cfg["dataset_path"], {})
            known = configs.setdefault(cfg.get("dataset_name") or DEFAULT_CONFIG, [])
            known.extend(s for s in splits if s not in known)

    for task in tasks:
        visit(task)
    return found


@functools.lru_cache(maxsize=1)
def _lm_eval_index() -> dict[str, Any]:
    from lm_eval.tasks import TaskManager

    return TaskManager().task_index  # indexing lm-eval's task library takes seconds: once


# ---- fetching (prefetch online) and reading (runs, online or not) --------------------------
def download(item: HubItem) -> None:
    """Fetch one item into the user's Hugging Face cache, with the libraries' progress bars."""
    if item.kind == "model":
        from huggingface_hub import snapshot_download

        snapshot_download(item.repo, allow_patterns=list(item.files or MODEL_FILES))
    else:
        import datasets

        datasets.load_dataset(item.repo, item.config)


def is_present(item: HubItem) -> bool:
    """Whether the item is in the user's cache, as the libraries will look for it offline."""
    if item.kind == "model":
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        # The item's own patterns: once a download has cached the repository's file list, a
        # snapshot asked for without them is "incomplete" for lacking the files never fetched.
        try:
            folder = Path(
                snapshot_download(item.repo, allow_patterns=list(item.files or MODEL_FILES), local_files_only=True)
            )
        except LocalEntryNotFoundError:
            return False
        names = [p.name for p in folder.rglob("*") if p.is_file()]
        if item.files:  # a tokenizer: any of its files
            return any(fnmatch.fnmatch(n, pattern) for n in names for pattern in item.files)
        return any(n.endswith(".json") for n in names) and any(n.endswith(".safetensors") for n in names)
    import datasets.config
    from datasets.naming import camelcase_to_snakecase

    # With HF_DATASETS_OFFLINE=1, `load_dataset` reads the tables `datasets` prepared when it
    # downloaded them: <cache>/<owner>___<name>/<config>/<version>/<revision>/.
    parts = item.repo.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    root = Path(datasets.config.HF_DATASETS_CACHE) / "___".join(parts) / (item.config or DEFAULT_CONFIG)
    return any(root.glob("*/*/dataset_info.json"))


def folder_name(repo: str) -> str:
    """A hub id as one folder's name, as the assets keep models: org/name -> org__name."""
    return repo.replace("/", "__")


def copy_model(repo: str, dest: Path, patterns: Sequence[str] | None = None) -> Path:
    """Copy a model repository's files (those matching `patterns`) from the cache into
    `dest` (downloading them first when online and not cached)."""
    from huggingface_hub import snapshot_download

    patterns = list(patterns or MODEL_FILES)
    folder = Path(snapshot_download(repo, allow_patterns=patterns))
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and any(fnmatch.fnmatch(rel.name, p) for p in patterns):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / rel)  # the blob the cache's link points to
    return dest


def load_dataset(repo: str, config: str | None = None, split: str | None = None):
    """`datasets.load_dataset`, from the cache when offline."""
    import datasets

    return datasets.load_dataset(repo, config, split=split)
