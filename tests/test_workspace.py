from __future__ import annotations

import pytest

from mlrb.run_files import workspace

pytestmark = pytest.mark.fast


def test_patch_shows_text_edits_new_files_and_binaries(tmp_path):
    starter = tmp_path / "starter"
    starter.mkdir()
    (starter / "merge.py").write_text("weights = [0.5, 0.5]\nprint('merge')\n")
    (starter / "notes.txt").write_text("delete me\n")
    ws = tmp_path / "ws"
    before = workspace.prepare(starter, ws)

    (ws / "merge.py").write_text("weights = [1.0, 1.0]\nprint('merge')\n")
    (ws / "notes.txt").unlink()
    (ws / "submission").mkdir()
    (ws / "submission" / "config.json").write_text('{"model_type": "llama"}\n')
    (ws / "submission" / "model.safetensors").write_bytes(b"\0\1\2" * 10)
    patch = workspace.diff(before, ws)

    assert "-weights = [0.5, 0.5]\n+weights = [1.0, 1.0]\n" in patch
    assert "--- a/notes.txt\n+++ /dev/null\n" in patch
    assert '+++ b/submission/config.json\n@@ -0,0 +1 @@\n+{"model_type": "llama"}' in patch
    assert "Binary file submission/model.safetensors added (30 bytes" in patch


def test_unchanged_workspace_gives_an_empty_patch(tmp_path):
    starter = tmp_path / "starter"
    starter.mkdir()
    (starter / "a.py").write_text("x = 1\n")
    before = workspace.prepare(starter, tmp_path / "ws")
    assert workspace.diff(before, tmp_path / "ws") == ""


def test_collect_copies_the_submission_and_never_follows_links_out(tmp_path):
    ws = tmp_path / "ws"
    (ws / "submission").mkdir(parents=True)
    (ws / "submission" / "weights.txt").write_text("w")
    secret = tmp_path / "secret.txt"
    secret.write_text("hidden answers")
    (ws / "submission" / "leak").symlink_to(secret)

    assert workspace.collect(ws, "submission", tmp_path / "out")
    assert (tmp_path / "out" / "weights.txt").read_text() == "w"
    assert (tmp_path / "out" / "leak").is_symlink()  # copied as a link, the secret's content not copied

    assert not workspace.collect(ws, "missing", tmp_path / "out2")
    assert not workspace.collect(ws, "../ws", tmp_path / "out3")  # a path that leaves the workspace


def test_read_only_files_are_restored_before_scoring(tmp_path):
    starter = tmp_path / "starter"
    (starter / "eval").mkdir(parents=True)
    (starter / "eval" / "score.py").write_text("def score(): return 0.5\n")
    (starter / "train.py").write_text("train()\n")
    ws = tmp_path / "ws"
    before = workspace.prepare(starter, ws)
    (ws / "eval" / "score.py").write_text("def score(): return 1.0\n")  # tampering
    (ws / "train.py").write_text("train(better=True)\n")  # allowed

    restored = workspace.restore_read_only(starter, ws, ["eval/*"], before)

    assert restored == ["eval/score.py"]
    assert (ws / "eval" / "score.py").read_text() == "def score(): return 0.5\n"
    assert (ws / "train.py").read_text() == "train(better=True)\n"
    (ws / "eval" / "score.py").unlink()
    assert workspace.restore_read_only(starter, ws, ["eval/*"], before) == ["eval/score.py"]


def test_a_walk_leaves_out_only_the_harness_s_files_by_name_and_python_s_caches_of_sources_there(tmp_path):
    for rel, content in [(".mlrb_budget.json", "{}"), (".mlrb_budget.json.part", "{}"),
                         (".mlrb_budget_tools/solve.py", "x"), (".mlrb_budget.jsonx", "x"),
                         ("sub/.mlrb_budget.json", "x"), ("__pycache__/hidden.py", "x"),
                         ("mod.py", "x"), ("__pycache__/mod.cpython-311.pyc", "x"),
                         ("__pycache__/gone.cpython-311.pyc", "x")]:  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)
    seen = {file.rel for file in workspace.walk(tmp_path)}
    assert seen == {".mlrb_budget_tools/solve.py", ".mlrb_budget.jsonx", "sub/.mlrb_budget.json",
                    "__pycache__/hidden.py", "mod.py", "__pycache__/gone.cpython-311.pyc"}  # fmt: skip


def test_past_the_patch_s_size_cap_a_changed_file_is_still_named(tmp_path, monkeypatch):
    before = workspace.snapshot(tmp_path)
    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / name).write_text("x" * 100 + "\n")
    monkeypatch.setattr(workspace, "MAX_PATCH_BYTES", 150)
    patch = workspace.diff(before, tmp_path)
    assert all(f"b/{name}" in patch for name in ("a.txt", "b.txt", "c.txt"))
    assert patch.count("not shown (the patch's size cap)") == 2
