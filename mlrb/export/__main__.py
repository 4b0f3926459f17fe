"""`python -m mlrb.export FORMAT ARGS...`: hands ARGS to the format's module (mlrb/export/__init__.py
lists them), imported only then."""

from __future__ import annotations

import importlib
import sys

from mlrb.export import FORMATS, help_text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(
            f"mlrb.export: error: name a format: {', '.join(FORMATS)} (python -m mlrb.export --help)", file=sys.stderr
        )
        return 2
    if argv[0] in ("-h", "--help"):
        print(help_text())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in FORMATS:
        print(f"mlrb.export: error: unknown format '{name}': the formats are {', '.join(FORMATS)}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(FORMATS[name])
    except ModuleNotFoundError as e:
        if e.name != FORMATS[name]:
            raise
        print(
            f"mlrb.export: error: the format '{name}' is not in this mlrb ({FORMATS[name]} is missing)", file=sys.stderr
        )
        return 2
    return int(module.main(rest))


if __name__ == "__main__":
    sys.exit(main())
