"""ICML 2024 AI4Math, track 1-1 (autoformalization): given a problem's informal statement
and proof, write its formal statement and proof in Lean 3.

Submission: a JSONL file, one line per held-out problem of $MLRB_DATA/test.jsonl:
    {"name": "<the problem's name>", "formal_proof": "<Lean 3 theorem with its proof>"}

Scoring: the file must be well formed (every line a JSON object with string `name` and
`formal_proof`, every held-out problem exactly once, no unknown names); otherwise it is
invalid with the first problem found. Then corpus BLEU (sacrebleu, the score) and mean
ROUGE-L F1 (rouge-score, on a tokenizer that keeps Lean's symbols) against the reference
formalizations, both 0-100, and the share of entries shaped like a Lean 3 declaration.
When a Lean toolchain is on the PATH, each entry is compiled on its own and the share
that compiles (no error, no `sorry`) is reported; otherwise that metric is absent and
the report says it was not measured. A toolchain that cannot compile the Mathlib imports
(Lean without Mathlib) is a scorer error naming Mathlib, not a compile rate of 0.

Calibration, at asset build: 0 = the baseline command (a seq2seq model fine-tuned
briefly), 100 = the reference command (the same trained longer; see the config).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrb.core.config import TaskConfig
from mlrb.task_kit import hub
from mlrb.tasks.base import ScaleSpec, ScoreReport, Task, packaged_task, scale_spec

# A Lean 3 declaration: optional attributes/comments, then theorem or lemma, a name and `:=`.
LEAN3_DECLARATION = re.compile(r"^\s*(?:@\[[^\]]*\]\s*)?(?:theorem|lemma)\s+\S+[\s\S]*:=", re.MULTILINE)
# Tokens for ROUGE: words, numbers, and each other non-space character (Lean's symbols).
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


@dataclass
class LeanSpec:
    # The Lean 3 executable; when it is not on the PATH the compile rate is not measured.
    command: str = "lean"
    # A Lean 3 project with mathlib (leanpkg.path) to compile in; None: a scratch folder.
    project_dir: str | None = None
    # Prepended to every entry before compiling.
    header: str = "import data.real.basic\nimport data.nat.basic\nimport data.int.basic\nimport tactic\n"
    timeout_s: float = 120.0


@dataclass
class MathReasoningScale(ScaleSpec):
    lean: LeanSpec = field(default_factory=LeanSpec)


def task(cfg: TaskConfig, environment: Path | None) -> Task:
    code = MathReasoning(scale_spec(cfg, MathReasoningScale))
    return packaged_task(cfg, code.spec, environment, module=__name__, score=code.score, download=code.download)


@dataclass(frozen=True)
class MathReasoning:
    """The task's own code, which its parts call: its scorer and its maker from the hub."""

    spec: MathReasoningScale

    def download(self, out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
        """Full scale: the competition's data and the baseline's model from the Hugging Face hub."""
        from mlrb.tasks.math_reasoning.assets import write_splits

        data = hub.load_dataset(params["dataset"])
        rows = [dict(row) for split in data.values() for row in split]
        facts = write_splits(rows, params["n_test"], params.get("seed", 0), out_dir)
        hub.copy_model(params["base_model"], out_dir / "public" / "base_model")
        return {"dataset": params["dataset"], "base_model": params["base_model"], **facts}

    # ---- scoring ---------------------------------------------------------------
    def score(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        references = read_rows(assets / "hidden" / "test.jsonl")
        problem, entries = parse_submission(submission, [r["name"] for r in references])
        if problem:
            return ScoreReport.invalid(problem)
        hypotheses = [entries[r["name"]] for r in references]
        targets = [r["formal_proof"] for r in references]
        bleu_score, signature = bleu(hypotheses, targets)
        metrics = {
            "bleu": bleu_score,
            "rougeL": rouge_l(hypotheses, targets),
            "lean3_form_share": sum(bool(LEAN3_DECLARATION.search(h)) for h in hypotheses) / len(hypotheses),
        }
        details: dict[str, Any] = {"n": len(hypotheses), "bleu_signature": signature}
        compiled = self.compile_share(hypotheses, Path(work_dir) / "lean")
        if isinstance(compiled, float):
            metrics["compile_rate"] = compiled
            details["compile"] = f"measured with `{self.spec.lean.command}`"
        else:
            details["compile"] = compiled
        return ScoreReport(True, "ok", score=metrics["bleu"], metrics=metrics, details=details)

    def compile_share(self, proofs: list[str], work_dir: Path):
        """Share of entries that compile with Lean, or a sentence saying why it was not measured."""
        lean = self.spec.lean
        executable = shutil.which(lean.command)
        if executable is None:
            return f"not measured: no Lean toolchain ('{lean.command}') on the PATH"
        work_dir.mkdir(parents=True, exist_ok=True)
        cwd = Path(lean.project_dir) if lean.project_dir else work_dir

        def compiles(name: str, text: str):
            """(whether it compiled, Lean's output); a timeout counts as not compiling."""
            source = work_dir / f"{name}.lean"
            source.write_text(lean.header + "\n" + text + "\n")
            try:
                proc = subprocess.run(
                    [executable, str(source)],
                    cwd=cwd,
                    capture_output=True,
                    text=True,
                    timeout=lean.timeout_s,
                    stdin=subprocess.DEVNULL,
                )
            except subprocess.TimeoutExpired:
                return False, "timed out"
            output = proc.stdout + proc.stderr
            return proc.returncode == 0 and ": error" not in output and "uses 'sorry'" not in output, output

        # A toolchain that cannot compile the header's imports (Lean without Mathlib) would fail
        # every entry: that is the scorer's fault, never a compile rate of 0.
        probe_ok, output = compiles("mathlib_probe", "example : (2 : ℕ) = 2 := rfl")
        if not probe_ok:
            first = next((line.strip() for line in output.splitlines() if line.strip()), "no output")
            raise RuntimeError(
                f"Lean ('{executable}') cannot compile the Mathlib imports every entry needs, so the compile "
                f"rate cannot be measured (is Mathlib missing? project_dir: {lean.project_dir}): {first[:300]}. "
                "Set task.scales.<scale>.lean.project_dir to a Lean 3 project with mathlib."
            )
        return sum(compiles(f"entry_{i}", proof)[0] for i, proof in enumerate(proofs)) / len(proofs)


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def parse_submission(submission: Path, names: list[str]):
    """(problem or "", {name: formal_proof}): the file's format, checked line by line."""
    if not submission.is_file() or submission.is_symlink():
        return 'the submission is not a file (expected JSONL: one {"name", "formal_proof"} per line)', {}
    try:
        text = submission.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return f"the submission cannot be read as UTF-8 text ({type(e).__name__})", {}
    entries: dict[str, str] = {}
    expected = set(names)
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            return f"line {number} is not valid JSON", {}
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("name"), str)
            or not isinstance(row.get("formal_proof"), str)
        ):
            return f"line {number} is not an object with string fields 'name' and 'formal_proof'", {}
        name = row["name"]
        if name not in expected:
            return f"line {number} names an unknown problem '{name[:80]}'", {}
        if name in entries:
            return f"line {number} repeats the problem '{name}'", {}
        entries[name] = row["formal_proof"]
    if not entries:
        return "the submission is empty: no formalizations", {}
    missing = [n for n in names if n not in entries]
    if missing:
        return f"{len(missing)} of {len(names)} problems have no entry (first: {missing[0]})", {}
    return "", entries


def bleu(hypotheses: list[str], references: list[str]):
    """Corpus BLEU (0-100) and sacrebleu's signature of how it was computed."""
    from sacrebleu.metrics import BLEU

    metric = BLEU()
    score = metric.corpus_score(hypotheses, [references]).score
    return float(score), str(metric.get_signature())


class _LeanTokenizer:
    """rouge-score's default tokenizer drops every non-alphanumeric character, which in
    Lean is most of the syntax; this one keeps each symbol as a token."""

    def tokenize(self, text: str) -> list[str]:
        return _TOKEN.findall(text)


def rouge_l(hypotheses: list[str], references: list[str]) -> float:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_LeanTokenizer())
    scores = [scorer.score(ref, hyp)["rougeL"].fmeasure for hyp, ref in zip(hypotheses, references, strict=True)]
    return 100.0 * sum(scores) / len(scores)
