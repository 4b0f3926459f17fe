"""What mlrb says to a user, kept short and safe to show: the error a bad config raises,
a text's or an error's first line, a URI with its secrets masked, and durations as
people read them. The lowest module of all: it imports nothing of mlrb's, so any
module may use it.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# Query parameters whose values are secrets (a tracking URI's ?token=...).
SECRET_QUERY = re.compile(r"(token|secret|password|passwd|key|auth|credential|signature)", re.IGNORECASE)


class ConfigError(ValueError):
    """A user-facing configuration problem, reported as one line."""


def first_line_of(text: str, limit: int = 200) -> str:
    """The first line that is not blank, cut to `limit` characters with "..." if longer."""
    line = next((part.strip() for part in (text or "").splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {first_line_of(str(error), 300)}"


def mask_uri(uri: str) -> str:
    """The URI with any password (user:PASSWORD@host) and secret query values masked."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if "@" not in parts.netloc and not parts.query:
        return uri
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"***@{host}"
    query = urlencode([(k, "***" if SECRET_QUERY.search(k) else v) for k, v in parse_qsl(parts.query)], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


# ---- durations ---------------------------------------------------------------------------


URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>,;)]+")


def mask_uris_in(text: str) -> str:
    """TEXT with every URI in it masked as `mask_uri` masks one (an error message that names
    its store, say)."""
    return URI_IN_TEXT.sub(lambda found: mask_uri(found.group(0)), text)


def duration(seconds: float | None) -> str:
    """A duration at a glance (reports, a sweep's end, a run's age): "45 s", "3.5 min", "2.25 h"."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def time_left(seconds: float) -> str:
    """A countdown to the second, as an agent is shown its budget: "1 h 05 min", "3 min 07 s", "42 s"."""
    seconds = int(max(0.0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def time_limit(seconds: float) -> str:
    """A limit as a task's instructions state it: "24 hour(s)", "90 minute(s)", "30 second(s)"."""
    if seconds >= 3600:
        return f"{seconds / 3600:g} hour(s)"
    if seconds >= 60:
        return f"{seconds / 60:g} minute(s)"
    return f"{seconds:g} second(s)"
