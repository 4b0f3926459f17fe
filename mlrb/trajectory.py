"""An append-only JSONL log of what the agent did, flushed line by line so a
crash mid-run leaves everything that happened before it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

MAX_FIELD_CHARS = 20_000


class Trajectory:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a", encoding="utf-8")

    def record(self, event: str, **fields: Any) -> None:
        entry = {"time": time.time(), "event": event, **{k: clip(v) for k, v in fields.items()}}
        self.file.write(json.dumps(entry, default=str) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def clip(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return value[:MAX_FIELD_CHARS] + f"[... {len(value) - MAX_FIELD_CHARS} more characters ...]"
    return value
