"""The asset cache checks every file it built before each use: a changed, truncated,
missing or added file gets the folder rebuilt, or a clear error naming the file; never a
silent wrong score, never the agent's fault."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import compose_config, mlflow_client, store_args
from mlrb.core.config import TaskConfig
from mlrb.harness.assets import MANIFEST, AssetError, ensure_assets, fingerprint, problems
from mlrb.tasks.base import packaged_task, scale_spec


class Counting:
    """The maker of a task whose assets are three small files; counts its builds."""

    def __init__(self):
        self.builds = 0
        self.broken = False

    def build(self, out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
        if self.broken:
            raise RuntimeError("the data source is gone")
        self.builds += 1
        (out_dir / "public").mkdir()
        (out_dir / "public" / "train.jsonl").write_text('{"x": 1}\n' * 100)
        (out_dir / "hidden").mkdir()
        (out_dir / "hidden" / "test.jsonl").write_text('{"answer": 2}\n' * 100)
        return {}


def not_used(*args: Any) -> Any:
    raise AssertionError("not used")


@pytest.fixture
def counting():
    return Counting()


@pytest.fixture
def task(counting):
    prompt = {key: "-" for key in ("task", "dataset", "dataset_shape", "models", "result", "evaluation")}
    scale = {"description": "tiny", "time_limit_s": 60, "baseline_command": "true", "prompt": prompt}
    cfg = TaskConfig(name="counting", title="Counting", scales={"tiny": scale})
    made = packaged_task(cfg, scale_spec(cfg), None, module=__name__, score=not_used, build=counting.build,
                         download=not_used)  # fmt: skip
    return dataclasses.replace(made, anchors=dataclasses.replace(made.anchors, measured_by=lambda out_dir, extra: {}))


def flip_one_byte(path: Path, offset: int = 5) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.fast
def test_the_manifest_records_every_file_and_a_fingerprint(task, counting, tmp_path):
    assets = ensure_assets(task, tmp_path)
    manifest = json.loads((assets / MANIFEST).read_text())
    assert set(manifest["files"]) == {"public/train.jsonl", "hidden/test.jsonl"}
    assert len(fingerprint(assets)) == 16 and problems(assets) == []
    assert ensure_assets(task, tmp_path) == assets and counting.builds == 1  # a sound folder is reused


@pytest.mark.fast
@pytest.mark.parametrize(
    "damage, named",
    [
        (lambda a: flip_one_byte(a / "hidden" / "test.jsonl"), "hidden/test.jsonl has changed"),
        (lambda a: (a / "public" / "train.jsonl").write_text('{"x": 1}\n'), "public/train.jsonl has changed"),
        (lambda a: (a / "hidden" / "test.jsonl").unlink(), "hidden/test.jsonl is missing"),
        (lambda a: (a / "hidden" / "extra.jsonl").write_text("{}"), "hidden/extra.jsonl was added"),
    ],
    ids=["one-byte", "truncated", "missing", "added"],
)
def test_damage_is_detected_named_and_rebuilt(task, counting, tmp_path, caplog, damage, named):
    assets = ensure_assets(task, tmp_path)
    good = fingerprint(assets)
    damage(assets)
    assert any(named in problem for problem in problems(assets))
    with caplog.at_level(logging.WARNING, logger="mlrb.harness.assets"):
        assert ensure_assets(task, tmp_path) == assets
    assert counting.builds == 2 and problems(assets) == [] and fingerprint(assets) == good
    assert named in caplog.text and "rebuilding" in caplog.text


@pytest.mark.fast
def test_damage_that_cannot_be_rebuilt_is_one_error_naming_the_file(task, counting, tmp_path):
    assets = ensure_assets(task, tmp_path)
    flip_one_byte(assets / "hidden" / "test.jsonl")
    counting.broken = True
    with pytest.raises(
        AssetError, match=r"damaged \(hidden/test.jsonl has changed.*could not be rebuilt: .*data source is gone"
    ):
        ensure_assets(task, tmp_path)


HOUSE_PRICE = Path(__file__).parent / "folder_tasks" / "house-price-mini"


@pytest.mark.integration
def test_assets_changed_during_a_run_are_rebuilt_before_scoring(tmp_path, caplog):
    """An unconfined agent can write the cache: scoring notices, rebuilds, and scores right.
    The checks are the same for every task; a small task folder keeps the rebuild quick."""
    from mlrb import run as run_lib
    from mlrb.core import registry

    cache = tmp_path / "cache"
    cfg = compose_config(*store_args(tmp_path, cache)[:2], "task=folder", f"task.path={HOUSE_PRICE}",
                         "task.higher_is_better=false", "sandbox=unconfined")  # fmt: skip
    # The agent makes one hidden price unreadable (scored unrepaired, its submission would be
    # invalid). The pattern matches only a built folder, not the one the first build stages.
    hidden = f"{cache}/house-price-mini/folder-????????????/hidden/answer.csv"
    cfg.task.scales["folder"]["baseline_command"] = (
        f'python train.py && for f in {hidden}; do [ ! -f "$f" ] || printf X | dd of="$f" bs=1 seek=10 conv=notrunc; done'
    )
    task = registry.load_task(cfg.task)
    with caplog.at_level(logging.WARNING, logger="mlrb.harness.assets"):
        result = run_lib.execute(cfg, tmp_path / "run")
    assert "hidden/answer.csv has changed" in caplog.text and "rebuilding" in caplog.text

    assets = ensure_assets(task, cache)
    assert problems(assets) == [] and b"X" not in (assets / "hidden" / "answer.csv").read_bytes()  # rebuilt
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("house-price-mini").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.status"] == "ok" and result.valid
    assert run.data.tags["mlrb.confined"] == "false" and run.data.tags["mlrb.sandbox"] == "unconfined"
    assert run.data.tags["mlrb.assets_fingerprint"] == fingerprint(assets)
    assert run.data.metrics["score"] == pytest.approx(run.data.metrics["baseline_score"], abs=1e-6)


@pytest.mark.fast
def test_the_key_holds_the_code_that_builds_and_scores_the_assets(tmp_path):
    """mlrb/task_kit/sources.py: a task package's files and the watched modules it imports,
    transitively; any change to them is another digest (so other assets), any other file is not."""
    from mlrb.task_kit import sources

    package = tmp_path / "my_task"
    (package / "starter").mkdir(parents=True)
    (package / "task.py").write_text("from mlrb.task_kit.tiny_models import write_jsonl\nimport json\n")
    (package / "starter" / "train.py").write_text("print('train')\n")
    files = {p.relative_to(sources.MLRB).as_posix() for p in sources.closure(package) if p.is_relative_to(sources.MLRB)}
    assert {
        "tasks/base.py",
        "tasks/handling.py",
        "task_kit/tiny_models.py",
        "scoring/report.py",
    } <= files  # base.py's own imports too
    assert not any(name.startswith(("tasks/llm_merging", "run.py", "cli.py")) for name in files)
    first = sources.digest(package)
    (package / "starter" / "train.py").write_text("print('train longer')\n")
    sources._digest.cache_clear()  # (one digest per process: code does not change under a run)
    second = sources.digest(package)
    assert second != first
    (tmp_path / "elsewhere.py").write_text("x = 1\n")  # beside the package, not in it
    sources._digest.cache_clear()
    assert sources.digest(package) == second
    # The folder's config and page: the config's values that make assets are in the key as the
    # scale's spec (a prompt or a time limit makes none), and a page makes none.
    (package / "task.yaml").write_text("title: My task\n")
    (package / "page.md").write_text("# My task\n")
    sources._digest.cache_clear()
    assert sources.digest(package) == second
    (package / "starter" / "notes.md").write_text("A starter file the agent reads.\n")  # the workspace's: it counts
    sources._digest.cache_clear()
    assert sources.digest(package) != second


@pytest.mark.fast
def test_a_folder_checked_whole_is_checked_again_without_reading_it_unless_a_file_changed(task, tmp_path,
                                                                                           monkeypatch):  # fmt: skip
    """At full scale the assets are GBs and every run checks them twice: once a full check has found
    the folder whole, a check whose files all stat the same reads none of them. A file written since,
    even with its time set back, is read again; so is a folder put in its place."""
    from mlrb.harness import assets as assets_lib

    assets = ensure_assets(task, tmp_path)
    read = []
    hash_file = assets_lib.sha256_of
    monkeypatch.setattr(assets_lib, "sha256_of", lambda path: read.append(path) or hash_file(path))
    # Just built: its files are too new to trust their times (a write in the same clock tick keeps
    # them), so it is checked in full, and a byte flipped at once is found.
    assert assets_lib.intact(assets) and len(read) == 2
    flip_one_byte(assets / "hidden" / "test.jsonl")
    assert not assets_lib.intact(assets)
    flip_one_byte(assets / "hidden" / "test.jsonl")  # (back as built)
    time.sleep(assets_lib.RACY_S + 0.1)
    read.clear()
    assert assets_lib.intact(assets) and len(read) == 2  # in full, and recorded
    assert assets_lib.intact(assets) and ensure_assets(task, tmp_path) == assets and read[2:] == []

    test_set = assets / "hidden" / "test.jsonl"
    times = test_set.stat()
    flip_one_byte(test_set)
    os.utime(test_set, ns=(times.st_atime_ns, times.st_mtime_ns))  # its size and mtime as they were
    assert not assets_lib.intact(assets) and len(read) > 2
    flip_one_byte(test_set)
    time.sleep(assets_lib.RACY_S + 0.1)
    assert assets_lib.intact(assets)

    shutil.copytree(assets, tmp_path / "copy")  # the same files, put in the folder's place
    shutil.rmtree(assets)
    (tmp_path / "copy").rename(assets)
    read.clear()
    assert assets_lib.intact(assets) and len(read) == 2
