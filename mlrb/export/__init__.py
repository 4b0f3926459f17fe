"""python -m mlrb.export FORMAT ARGS...: runs in another tool's format, from their run folders.

    python -m mlrb.export inspect RUN_OR_SWEEP_DIR... --out DIR   # Inspect eval logs
    python -m mlrb.export harbor TASK [--scale SCALE] --out DIR    # a task as a Harbor task folder
    python -m mlrb.export FORMAT --help                           # a format's own arguments

Each format is a module, imported only when it is asked for, whose `main(argv)` returns the
exit status (mlrb/export/__main__.py dispatches to it).
"""

from __future__ import annotations

FORMATS = {
    "inspect": "mlrb.export.inspect_log",  # not `inspect`: that name is the standard library's
    "harbor": "mlrb.export.harbor",
}


def help_text() -> str:
    """What `python -m mlrb.export --help` prints."""
    return "\n".join(
        [
            "usage: python -m mlrb.export FORMAT ARGS...",
            "",
            "Runs in another tool's format, from their run or sweep folders. FORMAT is one of:",
            "",
            "  inspect   Inspect eval logs: one per task and agent, the runs as samples, the seeds as epochs",
            "  harbor    a Harbor task folder of one of mlrb's tasks: prompt, limits, image, held-out verifier",
            "",
            "python -m mlrb.export FORMAT --help shows a format's own arguments.",
        ]
    )
