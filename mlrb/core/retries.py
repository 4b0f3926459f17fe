"""Retry policies, run by tenacity: each says how often a call is tried again and how
long it waits between tries. The LLM agent's policy comes from its config (see
mlrb/agents/llm.py), the metering proxy's upstream retries from whoever starts it
(mlrb/models/proxy.py); the tracking store's is `STORE_LOCKED` below.

tenacity is imported here and nowhere else, so every retry in mlrb waits on one schedule:
pause n (n = 1, 2, ...) is base_s * 2^(n-1), at most max_s.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tenacity

RetryState = tenacity.RetryCallState


@dataclass(frozen=True)
class Backoff:
    """At most `retries` retries after the first try, with exponential pauses between them."""

    retries: int
    base_s: float
    max_s: float
    # Add up to the pause again at random, so that processes waiting on one lock spread out.
    jitter: bool = False

    def pause_s(self, retry: int, at_least_s: float = 0.0) -> float:
        """The pause before retry number `retry` (1 for the first): exponential, or `at_least_s`
        when that is longer (a server's Retry-After), never past max_s."""
        exponential = self.base_s * 2.0 ** min(retry - 1, 64)  # the cap keeps a float, not an overflow
        pause = min(max(exponential, at_least_s), self.max_s)
        return pause + random.uniform(0, pause) if self.jitter else pause

    def retrying(
        self,
        retry_if: Callable[[BaseException], bool],
        pause_s: Callable[[RetryState], float] | None = None,
        before_sleep: Callable[[RetryState], None] | None = None,
    ) -> tenacity.Retrying:
        """A tenacity.Retrying that retries exceptions for which `retry_if` is true, then
        re-raises the last one. `pause_s` replaces the plain schedule (say, to honour a
        server's Retry-After); `before_sleep` sees each retry before its pause."""
        return tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retries + 1),
            wait=pause_s or (lambda state: self.pause_s(state.attempt_number)),
            retry=tenacity.retry_if_exception(retry_if),
            before_sleep=before_sleep,
            reraise=True,
        )


# SQLite lets one writer in at a time; the others get "database is locked" and try again.
STORE_LOCKED = Backoff(retries=11, base_s=0.2, max_s=5.0, jitter=True)


def database_is_locked(error: BaseException) -> bool:
    return "database is locked" in str(error)  # MlflowException or SQLAlchemy's OperationalError


def with_retries(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """call(*args, **kwargs) on the tracking store, retried while SQLite says another writer holds the lock."""
    return STORE_LOCKED.retrying(database_is_locked)(call, *args, **kwargs)
