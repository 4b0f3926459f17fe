"""What mlrb says to a user when something is wrong, kept safe to show: the error a bad
config raises, an error's first line, and a URI with its secrets masked. The lowest
module of all: it imports nothing of mlrb's, so any module may use it.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# Query parameters whose values are secrets (a tracking URI's ?token=...).
SECRET_QUERY = re.compile(r"(token|secret|password|passwd|key|auth|credential|signature)", re.IGNORECASE)


class ConfigError(ValueError):
    """A user-facing configuration problem, reported as one line."""


def first_line(error: BaseException) -> str:
    text = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {text[:300]}"


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
