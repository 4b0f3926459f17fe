"""python -m mlrb.export FORMAT ARGS...: runs in another tool's format.

    python -m mlrb.export inspect RUN_OR_SWEEP_DIR... --out DIR   # Inspect eval logs
    python -m mlrb.export harbor ...                              # Harbor's formats
    python -m mlrb.export FORMAT --help                           # a format's own options

Each format is a module, imported only when it is asked for, whose `main(argv)` returns the
exit status.
"""

from __future__ import annotations

import importlib
import sys

FORMATS = {
    "inspect": "mlrb.export.inspect_log",  # not `inspect`: that name is the standard library's
    "harbor": "mlrb.export.harbor",
}
USAGE = f"usage: python -m mlrb.export {{{','.join(FORMATS)}}} ARGS... (python -m mlrb.export FORMAT --help)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() if argv else USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in FORMATS:
        print(f"mlrb.export: error: unknown format '{name}': the formats are {', '.join(FORMATS)}", file=sys.stderr)
        return 2
    return int(importlib.import_module(FORMATS[name]).main(rest))


if __name__ == "__main__":
    sys.exit(main())
