"""A run's review: every rule (mlrb/review/rules.py) on its evidence, the findings, and the verdict,
`tampering` if any finding is, else `suspicious` if there is any, else `clean`. Written into the
run folder as `review.json`: the verdict, the rules it was reviewed by, and each finding with its
rule, severity, step and the quoted evidence (cut to EVIDENCE_CHARS, anything that looks like a
secret masked)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlrb.core import disk
from mlrb.core.messages import mask_uris_in
from mlrb.review import evidence as evidence_lib
from mlrb.review.rules import RULES, SUSPICIOUS, TAMPERING, Rule

FILE = "review.json"
CLEAN = "clean"
EVIDENCE_CHARS = 300
# What looks like a secret in quoted text: provider keys, tokens, NAME=VALUE of secret-named variables.
SECRETS = [
    re.compile(r"\b(?:sk-[A-Za-z0-9_-]{8,}|hf_[A-Za-z0-9]{12,}|gh[pousr]_[A-Za-z0-9]{12,}|AKIA[A-Z0-9]{12,})"),
    re.compile(r"(?i)(\b[\w-]*(?:api[_-]?key|token|secret|password)\s*[=:]\s*['\"]?)[^\s'\"]{4,}"),
]


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    step: int | None
    evidence: str
    reason: str | None = None  # the judge's own words on why (a rule's reason is the rule's)


@dataclass
class Review:
    run: str  # the run's name
    verdict: str
    findings: list[Finding] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)  # the rules it was reviewed by
    reviewed_at: float = 0.0
    # The model judge's read, when one was asked for (mlrb/review/judge.py): its model, status, cost.
    judge: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for a person: the run, its verdict, how many findings, the first."""
        said = f"{self.run}: {self.verdict}, {len(self.findings)} finding{'s' * (len(self.findings) != 1)}"
        if self.judge is not None:
            why = self.judge["reason"][:100]
            said += f" (judge {self.judge['status']}{': ' + why if why else ''})"
        if self.findings:
            first = self.findings[0]
            step = f" (step {first.step})" if first.step is not None else ""
            said += f"; {first.rule}{step}: {first.evidence[:160]}"
        return said


def masked(text: str) -> str:
    """TEXT with URIs' passwords and anything that looks like a secret replaced by ***."""
    text = mask_uris_in(text)
    text = SECRETS[0].sub("***", text)
    return SECRETS[1].sub(lambda m: m.group(1) + "***", text)


def quoted(text: str) -> str:
    text = masked(text)
    return text if len(text) <= EVIDENCE_CHARS else text[: EVIDENCE_CHARS - 3] + "..."


def verdict_of(findings: list[Finding]) -> str:
    severities = {f.severity for f in findings}
    return TAMPERING if TAMPERING in severities else SUSPICIOUS if SUSPICIOUS in severities else CLEAN


def review(run: evidence_lib.RunEvidence, rules: list[Rule] | None = None) -> Review:
    """Every rule on RUN: its findings and verdict."""
    rules = RULES if rules is None else rules
    findings = [Finding(r.name, r.severity, hit.step, quoted(hit.evidence)) for r in rules for hit in r.check(run)]
    return Review(run.name, verdict_of(findings), findings, [r.name for r in rules], round(time.time(), 3))


def review_folder(path: Path, judge: Callable[[evidence_lib.RunEvidence, Review], None] | None = None) -> Review:
    """The run in folder PATH reviewed with today's rules (and JUDGE, which may add to the review:
    mlrb/review/judge.py), its review.json written there; run_folder.NotARun when PATH holds no run."""
    run = evidence_lib.load(path)
    done = review(run)
    if judge is not None:
        judge(run, done)
    write(Path(path), done)
    return done


def write(run_dir: Path, done: Review) -> Path:
    file = Path(run_dir) / FILE
    text = json.dumps(done.to_dict(), indent=2) + "\n"
    disk.with_room(lambda: file.write_text(text, encoding="utf-8"))
    return file
