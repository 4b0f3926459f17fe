"""What scoring says about one submission: the tasks' scorers return it, the scoring
sandbox writes it as JSON, and the run records it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ScoreReport:
    """What the scorer says about one submission. `score` is None when invalid."""

    valid: bool
    reason: str
    score: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def invalid(cls, reason: str, **details: Any) -> ScoreReport:
        return cls(valid=False, reason=reason, details=dict(details))
