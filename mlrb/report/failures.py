"""The report's "Where agents fail": per task x agent (x model, budget... as the
results' rows), how its attempts ended, where its time went, and what it tried to reach that
the sandbox blocks.

- How attempts ended: runs by status; every attempt without a valid submission by why, its
  `mlrb.invalid_reason` put into one of a few classes (`reason_class`, from the messages the
  tasks' scorers write); agent errors by class (`error_class`: the HTTP status, the API
  failing otherwise, a command's exit code); budget stops by the limit that stopped them.
- Where the time went: each attempt's shares of its wall time (report/trajectories.py, its
  tool calls sorted by report/activity.py), averaged over the attempts with a trajectory.
- Integrity notes: per group, the runs (counted or not) with a call flagged as reaching hidden
  paths, other processes' environments or the network, and the first such call.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from mlrb.core.messages import duration
from mlrb.core.status import Status
from mlrb.report import activity
from mlrb.report.aggregate import GroupStats, mean
from mlrb.report.render import KIND_LABELS, Table, key_columns
from mlrb.report.runs import NOT_COUNTED, RunRow
from mlrb.report.trajectories import RunActivity

# Why a submission was not valid, from the scorers' messages (mlrb/scoring/runner.py, the tasks'
# task.py, mlrb/tasks/model_checks.py, mlrb/tasks/llm_merging/lineage.py): (class, what its reason says),
# the first that matches.
REASON_CLASSES: tuple[tuple[str, re.Pattern], ...] = (
    ("no submission", re.compile(r"^no submission")),
    ("timed out in scoring", re.compile(r"took longer than")),
    ("task's evaluation failed", re.compile(r"eval\.py get_score|`python main\.py [^`]*` exited")),
    (
        "wrong format",
        re.compile(
            r"not valid JSON|must hold a JSON object|is not an object|UTF-8|is empty|have no entry|unknown problem|"
            r"repeats the problem|not a folder|no tokenizer|no safetensors|symbolic links|pickled|config\.json is missing"
        ),
    ),
    (
        "breaks a rule",
        re.compile(
            r"not a merge|pretrained weights|exceed the limit|over the memory limit|not allowed|FP16/FP32|"
            r"instruction-tuned|custom code|do not derive|not an allowed"
        ),
    ),
    ("does not load", re.compile(r"cannot be (?:loaded|read|compared)")),
)
OTHER_REASON = "other"
NO_REASON = "no reason recorded"


def reason_class(reason: str) -> str:
    """The class of a scorer's reason for an invalid submission (REASON_CLASSES)."""
    if not reason.strip():
        return NO_REASON
    return next((name for name, pattern in REASON_CLASSES if pattern.search(reason)), OTHER_REASON)


def error_class(message: str) -> str:
    """The class of an agent error's message (mlrb/models/providers.py's ApiError, the baseline's
    and the command agent's exits): `HTTP 401`, `API unreachable`, `API reply not understood`,
    `API error`, `command exited 1`, or `other`."""
    status = re.search(r"\bHTTP (\d{3})\b", message)
    if status:
        return f"HTTP {status.group(1)}"
    if "unreachable" in message:
        return "API unreachable"
    if "not an API reply" in message or "returned no choices" in message:
        return "API reply not understood"
    if re.search(r"\bAPI\b", message):
        return "API error"
    exited = re.search(r"exited (-?\d+)", message)
    if exited:
        return f"command exited {exited.group(1)}"
    return "other"


def counts(counter: Counter) -> str:
    """'2 wrong format, 1 no submission': most first."""
    return ", ".join(f"{n} {name}" for name, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def rows_by_group(stats: Sequence[GroupStats], rows: Sequence[RunRow]) -> list[tuple[GroupStats, list[RunRow]]]:
    """Each results row (GroupStats) with its runs, in the results' order."""
    found: dict[tuple, list[RunRow]] = {}
    for row in rows:
        found.setdefault(row.group, []).append(row)
    return [(s, found.get(group_of(s), [])) for s in stats]


def group_of(s: GroupStats) -> tuple:
    return (s.task, s.scale, s.agent, s.model, s.budget, s.sandbox, s.confinement, s.assets)


# ---- how attempts ended ---------------------------------------------------------------------

ENDINGS = (Status.OK, Status.INVALID, Status.NO_SUBMISSION, Status.BUDGET_EXHAUSTED, Status.AGENT_ERROR)


def ending(runs: Sequence[RunRow]) -> dict[str, Any]:
    attempts = [r for r in runs if r.is_attempt]
    statuses = Counter(r.kind for r in runs)
    return {
        "runs": len(runs),
        **{status.value: statuses.get(status.value, 0) for status in ENDINGS},
        "not_counted": Counter({KIND_LABELS[k]: n for k, n in statuses.items() if k in NOT_COUNTED}),
        "limits": Counter(r.stop_reason or "?" for r in attempts if r.kind == Status.BUDGET_EXHAUSTED),
        "reasons": Counter(reason_class(r.invalid_reason) for r in attempts if not r.valid),
        "errors": Counter(error_class(r.agent_message or r.detail) for r in attempts if r.kind == Status.AGENT_ERROR),
    }


ENDINGS_INTRO = (
    'How each row\'s runs ended: runs by status (see "How runs count"); *budget exhausted* with the limits that '
    "stopped them; *not valid, why*: every attempt without a valid submission (whatever its status) by the class "
    "of the scorer's reason (no submission, timed out in scoring, the task's evaluation failed, wrong format, "
    "breaks a rule, does not load, other); *agent errors*: by class (the API's HTTP status, API unreachable, API "
    "reply not understood, API error, a command's exit code). `attempt_endings.csv` has the same."
)


def endings_table(stats: Sequence[GroupStats], rows: Sequence[RunRow]) -> Table:
    keys = key_columns(stats)
    headers = keys + [
        "runs",
        "ok",
        "invalid",
        "no submission",
        "budget exhausted",
        "agent error",
        "not counted",
        "not valid, why",
        "agent errors",
    ]
    body = []
    for s, runs in rows_by_group(stats, rows):
        e = ending(runs)
        exhausted = str(e[Status.BUDGET_EXHAUSTED.value])
        if e["limits"]:
            exhausted += f" ({counts(e['limits'])})"
        body.append(
            [getattr(s, k) for k in keys]
            + [
                str(e["runs"]),
                *(str(e[st.value]) for st in (Status.OK, Status.INVALID, Status.NO_SUBMISSION)),
                exhausted,
                str(e[Status.AGENT_ERROR.value]),
                counts(e["not_counted"]),
                counts(e["reasons"]),
                counts(e["errors"]),
            ]
        )
    return Table(headers, body)


ENDING_FIELDS = [
    "task",
    "scale",
    "agent",
    "model",
    "budget",
    "sandbox",
    "confinement",
    "assets",
    "runs",
    *(s.value for s in ENDINGS),
    "not_counted",
    "limits",
    "not_valid_why",
    "agent_errors",
]


def ending_records(stats: Sequence[GroupStats], rows: Sequence[RunRow]) -> list[dict[str, object]]:
    records = []
    for s, runs in rows_by_group(stats, rows):
        e = ending(runs)
        records.append(
            {
                **{k: getattr(s, k) for k in ENDING_FIELDS[:8]},
                "runs": e["runs"],
                **{st.value: e[st.value] for st in ENDINGS},
                "not_counted": counts(e["not_counted"]),
                "limits": counts(e["limits"]),
                "not_valid_why": counts(e["reasons"]),
                "agent_errors": counts(e["errors"]),
            }
        )
    return records


# ---- where the time went --------------------------------------------------------------------

TIME_INTRO = (
    "Where each row's attempts spent their wall time, from their trajectories: the mean over its attempts with "
    "a trajectory of each one's share. *waiting on the model*: model calls' latency and retry pauses; each tool "
    "call's duration goes to its class: *reading and exploring* (read_file, list_files, Read, Glob, Grep; shell "
    "commands such as ls, cat, head, grep, find), *editing* (write_file, edit_file, Edit, Write, apply_patch; "
    "sed -i, cp, output redirected into a file), *training or running scripts* (python, bash script.sh, torchrun..., "
    "sleep), *evaluating* (a script run that names eval or score: eval.py, --eval, lm_eval), *other* (installing "
    "packages, submit, and the time between calls: the agent's own and the harness's). A shell command line takes "
    "the most effortful class of its commands. Calls that overlap (parallel tool calls) are shares of their sum. "
    "*no trajectory*: attempts whose trajectory could not be read. `time_use.csv` has the same; `trajectories.csv` "
    "each run's seconds. The rule table: docs/reports.md."
)
SHARE_FIELDS = [f"share_{c}" for c in activity.CATEGORIES]


def time_use(runs: Sequence[RunRow], activities: dict[str, RunActivity | None]) -> dict[str, Any]:
    attempts = [r for r in runs if r.is_attempt]
    read = [a for a in (activities.get(r.run_id) for r in attempts) if a is not None]
    shares = [a.shares() for a in read]
    return {
        "attempts": len(attempts),
        "with_trajectory": len(read),
        "no_trajectory": len(attempts) - len(read),
        "wall_s_mean": mean([a.wall_s for a in read]),
        "tool_calls_mean": mean([float(a.tool_calls) for a in read]),
        **{f"share_{c}": mean([s[c] for s in shares]) for c in activity.CATEGORIES},
    }


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def time_table(stats: Sequence[GroupStats], rows: Sequence[RunRow], activities: dict[str, RunActivity | None]) -> Table:
    keys = key_columns(stats)
    headers = keys + [
        "attempts",
        "wall time",
        "tool calls",
        *(activity.LABELS[c] for c in activity.CATEGORIES),
        "no trajectory",
    ]
    body = []
    for s, runs in rows_by_group(stats, rows):
        t = time_use(runs, activities)
        calls = "-" if t["tool_calls_mean"] is None else f"{t['tool_calls_mean']:.3g}"
        body.append(
            [getattr(s, k) for k in keys]
            + [
                str(t["attempts"]),
                duration(t["wall_s_mean"]),
                calls,
                *(percent(t[f]) for f in SHARE_FIELDS),
                str(t["no_trajectory"]),
            ]
        )
    return Table(headers, body)


TIME_FIELDS = [
    "task",
    "scale",
    "agent",
    "model",
    "budget",
    "sandbox",
    "confinement",
    "assets",
    "attempts",
    "with_trajectory",
    "no_trajectory",
    "wall_s_mean",
    "tool_calls_mean",
    *SHARE_FIELDS,
]


def time_records(
    stats: Sequence[GroupStats], rows: Sequence[RunRow], activities: dict[str, RunActivity | None]
) -> list[dict[str, object]]:
    return [
        {**{k: getattr(s, k) for k in TIME_FIELDS[:8]}, **time_use(runs, activities)}
        for s, runs in rows_by_group(stats, rows)
    ]


# ---- integrity notes -------------------------------------------------------------------------

INTEGRITY_INTRO = (
    "Runs (counted or not) with a tool call that tried to reach what the sandbox blocks, by the text of its "
    "command or the paths it names (not whether it got there): *hidden paths* (a hidden/ folder, /root, /home/, "
    "the harness's files: mlrb, mlruns, mlflow.db), *other processes' environments* (/proc/PID/environ, ps e), "
    "*network* (curl, wget, pip install, git clone, an http(s) URL, a socket, WebFetch). Each cell: runs flagged "
    "(their calls flagged). `integrity_notes.csv` has the same; `trajectories.csv` each run's."
)


def integrity(runs: Sequence[RunRow], activities: dict[str, RunActivity | None]) -> dict[str, Any]:
    read = [(r, a) for r in runs if (a := activities.get(r.run_id)) is not None]
    found: dict[str, Any] = {"runs": len(runs), "with_trajectory": len(read)}
    examples = []
    for flag in activity.FLAGS:
        flagged = [(r, a) for r, a in read if a.flagged[flag]]
        found[f"{flag}_runs"] = len(flagged)
        found[f"{flag}_calls"] = sum(a.flagged[flag] for _, a in flagged)
        if flagged:
            examples.append(f"{flagged[0][0].name}: {flagged[0][1].examples[flag]}")
    found["example"] = examples[0] if examples else ""
    return found


def flagged_cell(runs: int, calls: int) -> str:
    return f"{runs} ({calls} call{'' if calls == 1 else 's'})" if runs else "0"


def integrity_table(
    stats: Sequence[GroupStats], rows: Sequence[RunRow], activities: dict[str, RunActivity | None]
) -> Table | None:
    """None when no run of any row was flagged."""
    keys = key_columns(stats)
    headers = keys + ["runs read", *(activity.FLAG_LABELS[f] for f in activity.FLAGS), "first flagged call"]
    body, any_flagged = [], False
    for s, runs in rows_by_group(stats, rows):
        n = integrity(runs, activities)
        cells = [flagged_cell(n[f"{f}_runs"], n[f"{f}_calls"]) for f in activity.FLAGS]
        any_flagged = any_flagged or bool(n["example"])
        body.append(
            [getattr(s, k) for k in keys] + [f"{n['with_trajectory']} of {n['runs']}", *cells, n["example"] or "-"]
        )
    return Table(headers, body) if any_flagged else None


INTEGRITY_FIELDS = [
    "task",
    "scale",
    "agent",
    "model",
    "budget",
    "sandbox",
    "confinement",
    "assets",
    "runs",
    "with_trajectory",
    *(f"{f}_{n}" for f in activity.FLAGS for n in ("runs", "calls")),
    "example",
]


def integrity_records(
    stats: Sequence[GroupStats], rows: Sequence[RunRow], activities: dict[str, RunActivity | None]
) -> list[dict[str, object]]:
    return [
        {**{k: getattr(s, k) for k in INTEGRITY_FIELDS[:8]}, **integrity(runs, activities)}
        for s, runs in rows_by_group(stats, rows)
    ]


# ---- per run ---------------------------------------------------------------------------------

RUN_FIELDS = [
    "run_id",
    "name",
    "task",
    "scale",
    "agent",
    "model",
    "budget",
    "seed",
    "kind",
    "trajectory",
    "wall_s",
    "tool_calls",
    "model_calls",
    *(f"{c}_s" for c in activity.CATEGORIES),
    *(f"{f}_calls" for f in activity.FLAGS),
    "flagged_example",
]


def run_records(rows: Sequence[RunRow], activities: dict[str, RunActivity | None]) -> list[dict[str, object]]:
    records = []
    for r in rows:
        a = activities.get(r.run_id)
        record: dict[str, object] = {
            "run_id": r.run_id,
            "name": r.name,
            "task": r.task,
            "scale": r.scale,
            "agent": r.agent,
            "model": r.model,
            "budget": r.budget,
            "seed": r.seed,
            "kind": r.kind,
            "trajectory": a is not None,
        }
        if a is not None:
            record.update(
                {
                    "wall_s": a.wall_s,
                    "tool_calls": a.tool_calls,
                    "model_calls": a.model_calls,
                    **{f"{c}_s": a.seconds[c] for c in activity.CATEGORIES},
                    **{f"{f}_calls": a.flagged[f] for f in activity.FLAGS},
                    "flagged_example": next(iter(a.examples.values()), ""),
                }
            )
        records.append(record)
    return records


# ---- the report's sections and files -----------------------------------------------------------

HEADING = "Where agents fail"


def report_sections(
    stats: Sequence[GroupStats], rows: Sequence[RunRow], activities: dict[str, RunActivity | None]
) -> list[tuple[str, str, Table | None]]:
    """(heading, intro, table) sections: how attempts ended, where the time went, integrity notes."""
    sections: list[tuple[str, str, Table | None]] = [
        (f"{HEADING}: how attempts ended", ENDINGS_INTRO, endings_table(stats, rows)),
        (f"{HEADING}: where the time went", TIME_INTRO, time_table(stats, rows, activities)),
    ]
    flagged = integrity_table(stats, rows, activities)
    if flagged is None:
        read = sum(a is not None for a in activities.values())
        sections.append(
            (
                f"{HEADING}: integrity notes",
                f"No tool call of the {read} runs with a trajectory tried "
                "to reach hidden paths, other processes' environments or the network.",
                None,
            )
        )
    else:
        sections.append((f"{HEADING}: integrity notes", INTEGRITY_INTRO, flagged))
    return sections


def csv_files(
    stats: Sequence[GroupStats], rows: Sequence[RunRow], activities: dict[str, RunActivity | None]
) -> list[tuple[str, list[str], list[dict[str, object]]]]:
    """(file name, fields, records) of the section's CSV files."""
    return [
        ("attempt_endings.csv", ENDING_FIELDS, ending_records(stats, rows)),
        ("time_use.csv", TIME_FIELDS, time_records(stats, rows, activities)),
        ("integrity_notes.csv", INTEGRITY_FIELDS, integrity_records(stats, rows, activities)),
        ("trajectories.csv", RUN_FIELDS, run_records(rows, activities)),
    ]
