"""The math_reasoning task at tiny scale: a whole baseline run through the CLI, malformed
submissions against the scorer, and the compile check with a stand-in Lean."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

import pytest

from conftest import anchors_of, baseline_run, mlflow_client, task_from_config

pytestmark = pytest.mark.system


def load_task():
    return task_from_config("math_reasoning")


@pytest.fixture(scope="module")
def assets(cache_dir) -> Path:
    from mlrb.harness.assets import ensure_assets

    return ensure_assets(load_task(), cache_dir)


def references(assets: Path) -> list[dict]:
    return [json.loads(line) for line in (assets / "hidden" / "test.jsonl").read_text().splitlines()]


def write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "submission.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def entry(name: str, proof: str) -> str:
    return json.dumps({"name": name, "formal_proof": proof})


def test_assets_have_the_real_datasets_fields_and_hide_the_references(assets):
    train = [json.loads(line) for line in (assets / "public" / "train.jsonl").read_text().splitlines()]
    public_test = [json.loads(line) for line in (assets / "public" / "test.jsonl").read_text().splitlines()]
    assert set(train[0]) == {"name", "informal_statement", "informal_proof", "formal_proof"}
    assert all(set(row) == {"name", "informal_statement", "informal_proof"} for row in public_test)
    assert [r["name"] for r in public_test] == [r["name"] for r in references(assets)]
    assert {r["name"] for r in train}.isdisjoint(r["name"] for r in public_test)
    assert all(r["formal_proof"].startswith(f"theorem {r['name']} ") for r in train)


def test_baseline_run_is_recorded_with_bleu_and_rouge(tmp_path, cache_dir, assets):
    run = baseline_run("math_reasoning", tmp_path, cache_dir)
    metrics = run.data.metrics  # its score: the build's anchor (baseline_run checks it)
    assert metrics["reference_score"] > metrics["baseline_score"] + 20
    assert 0 < metrics["rougeL"] <= 100
    assert "compile_rate" not in metrics  # no Lean on this machine: not measured, not 0
    local = mlflow_client(tmp_path).download_artifacts(
        run.info.run_id, "score_report.json", str(tmp_path / "artifacts")
    )
    assert "not measured: no Lean toolchain" in json.load(open(local))["details"]["compile"]


def test_the_references_themselves_score_100(assets, tmp_path):
    refs = references(assets)
    report = load_task().judge.score(
        write(tmp_path, [entry(r["name"], r["formal_proof"]) for r in refs]), assets, tmp_path
    )
    assert report.valid
    assert report.score == pytest.approx(100.0) and report.metrics["rougeL"] == pytest.approx(100.0)
    assert report.metrics["lean3_form_share"] == 1.0


def test_the_score_is_bleu_hand_checked_at_its_ends_and_halfway(assets, tmp_path):
    refs = references(assets)
    nothing_in_common = [entry(r["name"], "qqqq") for r in refs]  # no word any reference uses
    report = load_task().judge.score(write(tmp_path, nothing_in_common), assets, tmp_path)
    assert report.valid and report.score == 0.0 and report.metrics["rougeL"] == 0.0
    # Half the references, half nothing in common: ROUGE-L averages per problem (100 and 0), so
    # the share of references; BLEU pools n-grams over the corpus, so it lands strictly between its ends.
    half = [entry(r["name"], r["formal_proof"] if i % 2 else "qqqq") for i, r in enumerate(refs)]
    report = load_task().judge.score(write(tmp_path, half), assets, tmp_path)
    assert report.metrics["rougeL"] == pytest.approx(100 * (len(refs) // 2) / len(refs))
    assert 0.0 < report.score < 100.0 and report.score == report.metrics["bleu"]


# Numbers and one-letter names: what the cheapest shortcut swaps.
NUMBER_OR_NAME = re.compile(r"-?\d+|\b[a-z]\b")


def masked(text: str) -> str:
    return NUMBER_OR_NAME.sub(lambda m: "N" if m.group()[-1].isdigit() else "V", text)


def formulas(statement: str) -> str:
    return " ".join(re.findall(r"\$([^$]*)\$", statement))


def copied_formalizations(train: list[dict], test: list[dict]) -> list[str]:
    """The cheapest shortcut, no learning: for each held-out problem the formal proof of the
    training problem whose formulas are most alike (numbers and names masked), its numbers
    and names swapped, in order of appearance, for the held-out problem's."""
    keys = [masked(formulas(r["informal_statement"])) for r in train]
    copied = []
    for row in test:
        key = masked(formulas(row["informal_statement"]))
        source = train[max(range(len(train)), key=lambda i: difflib.SequenceMatcher(None, keys[i], key).ratio())]
        swaps = dict(zip(NUMBER_OR_NAME.findall(formulas(source["informal_statement"])),
                         NUMBER_OR_NAME.findall(formulas(row["informal_statement"])), strict=False))  # fmt: skip
        proof = NUMBER_OR_NAME.sub(lambda m, swaps=swaps: swaps.get(m.group(), m.group()), source["formal_proof"])
        copied.append(proof.replace(source["name"], row["name"]))
    return copied


def test_copying_the_most_alike_training_proof_does_not_beat_the_reference(assets, tmp_path, cache_dir):
    train = [json.loads(line) for line in (assets / "public" / "train.jsonl").read_text().splitlines()]
    public_test = [json.loads(line) for line in (assets / "public" / "test.jsonl").read_text().splitlines()]

    # No held-out problem has a training problem's shape: its Lean, numbers and names masked.
    def shape(row: dict) -> str:
        return masked(row["formal_proof"].split(" ", 2)[2])  # after "theorem <name> "

    assert not {shape(r) for r in references(assets)} & {shape(r) for r in train}
    copied = copied_formalizations(train, public_test)
    report = load_task().judge.score(write(tmp_path, [entry(r["name"], p) for r, p in zip(public_test, copied, strict=True)]),
                               assets, tmp_path)  # fmt: skip
    anchors = anchors_of("math_reasoning", cache_dir)
    normalised = (
        100 * (report.score - anchors["baseline_score"]) / (anchors["reference_score"] - anchors["baseline_score"])
    )
    assert report.valid and report.score < anchors["reference_score"], f"copying scores {normalised:.0f} normalised"


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda refs: [], "the submission is empty"),
        (lambda refs: [entry(refs[0]["name"], "x"), "{not json"], "line 2 is not valid JSON"),
        (lambda refs: [json.dumps({"name": refs[0]["name"]})], "line 1 is not an object with string fields"),
        (lambda refs: [json.dumps({"name": refs[0]["name"], "formal_proof": 3})], "string fields"),
        (lambda refs: [entry(r["name"], "x") for r in refs[:-1]], "problems have no entry"),
        (lambda refs: [entry(refs[0]["name"], "x")] * 2, "line 2 repeats the problem"),
        (lambda refs: [entry("mathd_algebra_999", "x")], "names an unknown problem 'mathd_algebra_999'"),
    ],
)
def test_malformed_submissions_are_invalid_with_the_reason(assets, tmp_path, make, reason):
    report = load_task().judge.score(write(tmp_path, make(references(assets))), assets, tmp_path)
    assert not report.valid and report.score is None
    assert reason in report.reason


def test_a_folder_or_a_missing_file_is_invalid(assets, tmp_path):
    (tmp_path / "folder").mkdir()
    assert "not a file" in load_task().judge.score(tmp_path / "folder", assets, tmp_path).reason
    assert "not a file" in load_task().judge.score(tmp_path / "absent.jsonl", assets, tmp_path).reason


def test_the_compile_rate_is_measured_when_lean_is_on_the_path(assets, tmp_path, monkeypatch):
    # A stand-in for Lean 3: reports an error for files containing BROKEN, a sorry warning for sorry.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "lean"
    fake.write_text(
        "#!/bin/sh\n"
        'if grep -q BROKEN "$1"; then echo "$1:5:0: error: unknown identifier"; exit 1; fi\n'
        'if grep -q sorry "$1"; then echo "$1:5:8: warning: declaration uses \'sorry\'"; fi\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    refs = references(assets)
    proofs = [r["formal_proof"] for r in refs]
    proofs[0] = proofs[0].replace("begin", "begin\n  sorry,")
    proofs[1] = proofs[1] + " BROKEN"
    report = load_task().judge.score(
        write(tmp_path, [entry(r["name"], p) for r, p in zip(refs, proofs, strict=True)]), assets, tmp_path
    )
    assert report.valid
    assert report.metrics["compile_rate"] == pytest.approx((len(refs) - 2) / len(refs))
    assert report.details["compile"].startswith("measured")


def test_lean_without_mathlib_is_an_infrastructure_error_naming_it(assets, tmp_path, monkeypatch):
    # A stand-in for Lean 3 installed without Mathlib: every import fails, as the real one reports it.
    from mlrb.scoring.runner import ScorerError, score_submission

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "lean"
    fake.write_text("#!/bin/sh\necho \"$1:1:0: error: file 'data/real/basic' not found in the LEAN_PATH\"\nexit 1\n")
    fake.chmod(0o755)
    from mlrb.core.config import SandboxConfig

    task = task_from_config("math_reasoning", lean={"command": str(fake)})
    refs = references(assets)
    submission = write(tmp_path, [entry(r["name"], r["formal_proof"]) for r in refs])
    with pytest.raises(ScorerError, match="Mathlib") as failure:
        # unconfined: the stand-in lives in a temporary folder no sandbox shows
        score_submission(task, submission, assets, tmp_path / "scoring", SandboxConfig(kind="unconfined"))
    assert "not found in the LEAN_PATH" in str(failure.value)
