"""Where a sandbox reaches the run's metering proxy (mlrb/models/proxy.py). Standard library only,
so that a sandbox can name it without loading the proxy's HTTP server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelEndpoint:
    """Where the run's metering proxy listens: a unix socket, which a confined sandbox mounts (its
    only way out), and a loopback URL, which an unconfined one uses."""

    socket: Path
    url: str
