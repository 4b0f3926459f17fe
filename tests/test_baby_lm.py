"""The baby_lm task at tiny scale: the minimal pairs, the shared from-scratch rule checks,
a whole baseline run through the CLI, and each rule broken once against the scorer."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from conftest import baseline_run, run_cli, task_from_config
from mlrb.tasks import model_checks
from mlrb.tasks.handling import solutions_of


def load_task(**overrides):
    return task_from_config("baby_lm", **overrides)


@pytest.fixture(scope="module")
def assets(cache_dir) -> Path:
    from mlrb.harness.assets import ensure_assets

    return ensure_assets(load_task(), cache_dir)


def checkpoint_copy(assets: Path, tmp_path: Path) -> Path:
    sub = tmp_path / "submission"
    shutil.copytree(assets / "hidden" / "known_checkpoints" / "mlrb__tiny-gpt2", sub)
    return sub


# ---- data and rules without assets ---------------------------------------------


@pytest.mark.fast
def test_minimal_pairs_differ_in_one_word_and_are_balanced():
    from mlrb.tasks.from_scratch import blimp

    for uid in blimp.PHENOMENA:
        rows = blimp.minimal_pairs(random.Random(0), uid, 40)
        assert len({r["sentence_good"] for r in rows}) == 40
        for row in rows:
            good, bad = row["sentence_good"].split(), row["sentence_bad"].split()
            assert len(good) == len(bad) and sum(g != b for g, b in zip(good, bad, strict=True)) == 1, row
        # Half the pairs have the singular (or "he") form correct: no blind preference wins.
        assert sum(singular_is_correct(uid, row) for row in rows) == 20, uid


def singular_is_correct(uid: str, row: dict) -> bool:
    """Whether the word the pair's sentences differ in is the singular (or "he") form in the good one."""
    from mlrb.tasks.from_scratch import grammar

    good, bad = next(
        (g.rstrip("."), b.rstrip("."))
        for g, b in zip(row["sentence_good"].split(), row["sentence_bad"].split(), strict=True)
        if g != b
    )
    if uid == "anaphor_gender_agreement":
        return good == "himself"
    if uid == "anaphor_number_agreement":
        return bad == "themselves"
    nouns = grammar.CREATURES + grammar.IRREGULAR_CREATURES + grammar.THINGS
    verbs = grammar.INTRANSITIVE + grammar.TRANSITIVE + grammar.REFLEXIVE_VERBS
    singular = {n.form(False) for n in nouns} | {v.agree(False) for v in verbs}
    plural = {n.form(True) for n in nouns} | {v.agree(True) for v in verbs}
    assert (good in singular and bad in plural) != (good in plural and bad in singular), row
    return good in singular


@pytest.mark.fast
def test_made_up_names_are_used_unevenly_in_the_corpus_and_evenly_in_the_pairs():
    from collections import Counter

    from mlrb.tasks.baby_lm.assets import source_text
    from mlrb.tasks.from_scratch import blimp
    from mlrb.tasks.from_scratch.grammar import NAMES, Grammar, People

    people = People.made_up(random.Random(7), 40, 1.0)
    he, she = people.names["he"], people.names["she"]
    assert len(he) == len(she) == 20 and not set(he) & set(she) and not set(he + she) & set(NAMES["he"] + NAMES["she"])
    corpus = source_text(Grammar(random.Random(8), people), 0.3, 60000)
    used = Counter(word for word in corpus.replace(".", " ").split() if word in he + she)
    counts = sorted(used.values(), reverse=True)
    assert counts[0] > 20 * counts[-1]  # a Zipf law: a few names most of the time
    # A name is followed by the reflexive of its own gender only.
    for name in he:
        assert f"{name} sees herself" not in corpus and f"{name} hurts herself" not in corpus
    # The hidden pairs ask every name's gender about as often, however rare it is in the corpus.
    rows = blimp.minimal_pairs(random.Random(9), "anaphor_gender_agreement", 200, people)
    asked = Counter(row["sentence_good"].split()[0] for row in rows)
    assert set(asked) == set(he + she) and max(asked.values()) < 5 * min(asked.values())
    assert all(row["sentence_good"].endswith("himself.") == (row["sentence_good"].split()[0] in he) for row in rows)


def save_matrices(folder: Path, tensors: dict) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.fast
def test_copied_matrices_are_found_however_they_are_disguised(tmp_path):
    import torch

    torch.manual_seed(0)
    w, e = torch.randn(64, 32) * 0.02, torch.randn(100, 32) * 0.02
    mask = torch.tril(torch.ones(1, 1, 16, 16))  # a buffer, the same in every model of its shape
    checkpoint = save_matrices(tmp_path / "ckpt", {"h.0.w": w, "wte": e, "ln.weight": torch.ones(32), "h.0.mask": mask})
    cases = {
        "copied": {"h.0.w": w.clone(), "wte": torch.randn(100, 32)},
        "fine_tuned": {"h.0.w": w + 0.5 * w.std() * torch.randn_like(w), "wte": torch.randn(100, 32)},
        "rescaled_and_transposed": {"layers.0.proj": -3 * w.t().contiguous(), "wte": torch.randn(100, 32)},
        "fresh": {
            "h.0.w": torch.randn(64, 32) * 0.02,
            "wte": torch.randn(100, 32),
            "ln.weight": torch.ones(32),
            "h.0.mask": mask.clone(),
        },
    }
    found = {
        name: model_checks.checkpoint_copies(save_matrices(tmp_path / name, t), checkpoint) for name, t in cases.items()
    }
    assert [c["checkpoint_tensor"] for c in found["copied"]] == ["h.0.w"]
    assert found["copied"][0]["similarity"] == pytest.approx(1.0)
    assert [c["checkpoint_tensor"] for c in found["fine_tuned"]] == ["h.0.w"]
    assert [c["checkpoint_tensor"] for c in found["rescaled_and_transposed"]] == ["h.0.w (transposed)"]
    assert found["fresh"] == []  # independent weights; vectors (norms) and masks are never compared
    problem, facts = model_checks.check_not_known_checkpoint(tmp_path / "copied", {"org/ckpt": checkpoint})
    assert "come from the public checkpoint org/ckpt" in problem and "trained from scratch" in problem


@pytest.mark.fast
def test_sub_task_scores_are_read_from_lm_eval_results_under_their_own_names():
    from mlrb.tasks.from_scratch.suites import subtask_scores

    raw = {
        "results": {
            "blimp": {"acc,none": 0.7},
            "blimp_anaphor_number_agreement": {"acc,none": 0.9},
            "sglue_rte": {"acc,none": 0.55},
            "record": {"f1,none": 0.3, "em,none": 0.2},
            "mlrb_suite_copa": {"acc,none": 0.8, "acc_stderr,none": 0.1},
        },
        "group_subtasks": {"blimp": ["blimp_anaphor_number_agreement"]},
    }
    assert subtask_scores(raw, "mlrb_suite") == {
        "anaphor_number_agreement": 0.9, "copa": 0.8, "record": 0.3, "rte": 0.55,
    }  # fmt: skip


@pytest.mark.fast
def test_full_scale_config_names_the_papers_setup(tmp_path):
    result = run_cli("--cfg", "job", "--resolve", "task=baby_lm", "task.scale=full", "budget=paper", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())  # YAML folds long strings over lines
    for fact in ("dataset: AlgorithmicResearchGroup/babylm", "- blimp", "gpu_type: A100-40GB", "- distilgpt2",
                 "--layers 6 --heads 12 --width 768 --context 1024", "wall_time_s: 86400"):  # fmt: skip
        assert fact in out, fact


# ---- the task ------------------------------------------------------------------


@pytest.mark.system
def test_assets_hide_the_pairs_and_the_baseline_beats_an_untrained_model(assets):
    public = {p.relative_to(assets / "public").as_posix() for p in (assets / "public").rglob("*") if p.is_file()}
    assert {"data/train.jsonl", "data/dev.jsonl", "data/test.jsonl", "tokenizer/tokenizer.json"} <= public
    rows = [json.loads(line) for line in (assets / "public" / "data" / "train.jsonl").read_text().splitlines()]
    assert [r["filename"] for r in rows][:2] == ["childes.train", "bnc_spoken.train"] and len(rows) == 6
    corpus = "\n".join(r["content"] for r in rows)
    suite = json.loads((assets / "hidden" / "suite.json").read_text())
    assert len(suite["subtasks"]) == 7 and set(suite["subtasks"].values()) == {"blimp"}
    bad = [json.loads(line)["sentence_bad"] for line in
           (assets / "hidden" / "suite" / "anaphor_gender_agreement.jsonl").read_text().splitlines()]  # fmt: skip
    assert not any(sentence in corpus for sentence in bad)  # the corpus is grammatical
    calibration = json.loads((assets / "hidden" / "calibration.json").read_text())
    assert abs(calibration["do_nothing_score"] - 0.5) < 0.1  # at chance
    # The cautious baseline learns the easiest rule; the reference learns them all.
    assert calibration["baseline_score"] > calibration["do_nothing_score"] + 0.05
    assert calibration["reference_score"] > calibration["baseline_score"] + 0.25


@pytest.mark.system
def test_baseline_run_is_recorded_with_its_score(tmp_path, cache_dir, assets):
    metrics = baseline_run("baby_lm", tmp_path, cache_dir).data.metrics
    assert metrics["valid"] == 1.0 and metrics["success"] == 0.0
    subtasks = {k for k in metrics if k.startswith("score.")}
    assert {"score.anaphor_gender_agreement", "score.distractor_agreement_relative_clause"} <= subtasks
    assert len(subtasks) == 7


@pytest.mark.system
def test_a_public_checkpoint_is_invalid_even_fine_tuned(assets, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sub = checkpoint_copy(assets, tmp_path)
    report = load_task().judge.score(sub, assets, tmp_path / "work")
    assert not report.valid and report.score is None
    assert "pretrained weights" in report.reason and "mlrb/tiny-gpt2" in report.reason

    # A few steps of further training on the corpus do not make it a model trained from scratch.
    model, tokenizer = AutoModelForCausalLM.from_pretrained(sub), AutoTokenizer.from_pretrained(sub)
    text = json.loads((assets / "public" / "data" / "train.jsonl").read_text().splitlines()[0])["content"]
    ids = torch.tensor(tokenizer(text[:20000])["input_ids"][: 16 * 64]).reshape(16, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(20):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    tuned = tmp_path / "tuned"
    model.save_pretrained(tuned)
    tokenizer.save_pretrained(tuned)
    report = load_task().judge.score(tuned, assets, tmp_path / "work2")
    assert not report.valid and "pretrained weights" in report.reason


@pytest.mark.system
def test_an_honest_run_with_any_small_seed_is_trained_from_scratch(assets, tmp_path):
    # Seeds 0-2 are what agents pick; none may start from the hidden checkpoint's weights.
    task = load_task()
    for seed in (1, 2):
        # the seed as a sweep's run passes it: $MLRB_SEED, which the baseline command gives as --seed
        workspace = solutions_of(task, assets / "public").run(task.spec.baseline_command + " --max-steps 40",
                                                         tmp_path / f"seed{seed}", seed=seed)  # fmt: skip
        report = task.judge.score(workspace / "submission", assets, tmp_path / f"work{seed}")
        assert report.valid, (seed, report.reason)
        assert "copied_from" not in report.details["pretrained_check"]


@pytest.mark.system
def test_too_large_corrupt_or_empty_submissions_are_invalid(assets, tmp_path):
    big = load_task(max_params=1000).judge.score(checkpoint_copy(assets, tmp_path), assets, tmp_path / "w1")
    assert not big.valid and "exceed the limit of 1,000" in big.reason

    (tmp_path / "empty").mkdir()
    assert "config.json is missing" in load_task().judge.score(tmp_path / "empty", assets, tmp_path / "w2").reason

    corrupt = tmp_path / "corrupt"
    shutil.copytree(tmp_path / "submission", corrupt)
    weights = corrupt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    report = load_task().judge.score(corrupt, assets, tmp_path / "w3")
    assert not report.valid and "the weights cannot be read" in report.reason

    (tmp_path / "submission" / "model.safetensors").unlink()
    report = load_task().judge.score(tmp_path / "submission", assets, tmp_path / "w4")
    assert not report.valid and "no safetensors weights" in report.reason
