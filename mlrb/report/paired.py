"""Paired comparisons of agents, and how many seeds a comparison needs.

A *side* is the runs of one agent, one model (`agent.options.model`) or one sweep, by the name
the user gave. Sides are compared on the report's counted normalised score (mlrb/analysis/counting.py: a
failed attempt counts as doing nothing; 0 = baseline, 100 = reference), run against run: a run
of A and a run of B *pair* when they ran the same task (and scale) with the same seed. Pairing
takes out what the two runs share (the task, its assets and anchors, the seed its commands get),
so a difference needs fewer seeds to show than two unpaired means would.

What does not pair is said, never dropped silently: a seed only one side ran, a run not
counted (an infrastructure error, killed, still running), an attempt without a counted score.

- per task: the mean difference A - B over its pairs, a 95% percentile bootstrap interval
  (its seeds resampled) and a sign-flip p-value (mlrb/analysis/stats.py);
- overall: the mean over tasks of the per-task differences (each task weighs the same), its
  interval resampling tasks as clusters and then seeds within them, and its p-value;
- A beats B when the overall interval excludes 0 and p < 0.05; otherwise we cannot tell;
- more than two sides: every pair compared, p-values Holm-adjusted, and the groups that no
  significant difference separates;
- a plan: seeds per task for a paired test to detect an effect, from the noise of the runs
  at hand (or the tasks' calibration when there are none).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from mlrb.analysis import stats
from mlrb.core.tags import Metric
from mlrb.report import flagged
from mlrb.report.aggregate import mean, present
from mlrb.report.render import KIND_LABELS, Table, dollars
from mlrb.report.runs import COST_NAMES, COSTS, RunRow

ALPHA = 0.05
LEVEL = 1 - ALPHA
RESAMPLES = 10_000
SCORE = "counted normalised score (0 = baseline, 100 = reference; a failed attempt counts as doing nothing)"
METHOD = (
    f"Interval: {LEVEL:.0%} percentile bootstrap of the mean difference, seeds resampled within each task; "
    "overall, the mean over tasks (each weighs the same), tasks resampled as clusters, then seeds within them; "
    "read at Hesterberg's expanded level so that few pairs give a wider interval, as a t interval would. "
    "p: two-sided paired sign-flip permutation test (each pair's difference keeps or flips its sign; "
    f"exact up to {stats.EXACT_UP_TO} pairs, else 20,000 random flips). "
    f"A beats B when the interval excludes 0 and p < {ALPHA:g}."
)
# The conditions (RunRow attributes) two sides may differ in beyond what names them: noted.
CONDITIONS = ("budget", "scale", "sandbox", "confinement", "assets")
# What tells two runs of one side at one task and seed apart, to say why they are ambiguous: (attribute, as said).
DISTINCT = (
    ("agent", "agent"),
    ("experiment", "experiment"),
    ("model", "model"),
    ("sweep_id", "sweep"),
    ("budget", "budget"),
    ("sandbox", "sandbox"),
    ("confinement", "confinement"),
    ("assets", "assets"),
)


class CompareError(Exception):
    """A user-facing problem, reported as one line."""


# ---- sides ---------------------------------------------------------------------------------


def names_in(rows: Sequence[RunRow]) -> str:
    """The agents, models and sweeps that can name a side, for an error message."""
    kinds = (
        ("agents", {r.agent for r in rows}),
        ("models", {r.model for r in rows}),
        ("sweeps", {r.sweep_id for r in rows}),
    )
    return (
        "; ".join(f"{label} {', '.join(sorted(v for v in values if v))}" for label, values in kinds if any(values))
        or "none"
    )


def resolve(rows: Sequence[RunRow], names: Sequence[str], where: str) -> dict[str, list[RunRow]]:
    """Each name's runs: those whose agent, model or sweep id it is. `where` says which runs were
    searched (the filters), for the message when a name matches none."""
    sides: dict[str, list[RunRow]] = {}
    for name in names:
        if name in sides:
            raise CompareError(f"'{name}' is named twice; name each agent, model or sweep once")
        matched = [r for r in rows if name in (r.agent, r.model, r.sweep_id)]
        if not matched:
            raise CompareError(f"unknown agent, model or sweep id '{name}' in {where}; there: {names_in(rows)}")
        sides[name] = matched
    for (a, rows_a), (b, rows_b) in combinations(sides.items(), 2):
        shared = {r.run_id for r in rows_a} & {r.run_id for r in rows_b}
        if shared:
            example = next(r.name for r in rows_a if r.run_id in shared)
            raise CompareError(
                f"'{a}' and '{b}' share {len(shared)} runs (such as {example}): name sides that have no run in common"
            )
    return sides


def stratum_labeller(rows: Sequence[RunRow]) -> Callable[[tuple[str, str]], str]:
    """(task, scale) -> how tables name it: the task, and its scale when scales vary."""
    several = len({r.scale for r in rows}) > 1
    return lambda key: f"{key[0]} ({key[1]})" if several else key[0]


def seed_order(seed: str) -> tuple:
    return (0, int(seed), "") if seed.isdigit() else (1, 0, seed)


def by_stratum_and_seed(rows: Sequence[RunRow]) -> dict[tuple[str, str], dict[str, list[RunRow]]]:
    found: dict[tuple[str, str], dict[str, list[RunRow]]] = {}
    for r in rows:
        found.setdefault((r.task, r.scale), {}).setdefault(r.seed, []).append(r)
    return found


def counted_value(row: RunRow) -> float | None:
    """Its counted normalised score; None for a run a comparison leaves out (RunRow.left_out)."""
    value = row.counted_normalised
    return None if value is None or math.isnan(value) or row.left_out else value


# ---- two sides -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    seed: str
    a: RunRow
    b: RunRow
    value_a: float  # their counted normalised scores
    value_b: float

    @property
    def diff(self) -> float:
        return self.value_a - self.value_b


@dataclass
class TaskResult:
    task: str
    pairs: list[Pair]
    unpaired: int  # this task's seeds left out
    interval: tuple[float, float] | None
    p: float | None

    @property
    def diffs(self) -> list[float]:
        return [p.diff for p in self.pairs]

    @property
    def diff(self) -> float:
        return sum(self.diffs) / len(self.diffs)

    @property
    def mean_a(self) -> float:
        return sum(p.value_a for p in self.pairs) / len(self.pairs)

    @property
    def mean_b(self) -> float:
        return sum(p.value_b for p in self.pairs) / len(self.pairs)


def significant(diff: float | None, interval: tuple[float, float] | None, p: float | None) -> int:
    """+1 when A is significantly ahead, -1 when behind, 0 when we cannot tell."""
    if diff is None or interval is None or p is None or p >= ALPHA:
        return 0
    if interval[0] > 0:
        return 1
    return -1 if interval[1] < 0 else 0


def signed(value: float) -> str:
    return f"{value:+.1f}"


def span(interval: tuple[float, float] | None) -> str:
    return "-" if interval is None else f"[{interval[0]:.1f}, {interval[1]:.1f}]"


def p_text(p: float | None) -> str:
    if p is None:
        return "-"
    return "< 0.001" if p < 0.001 else f"{p:.3f}" if p < 0.01 else f"{p:.2f}"


def p_phrase(p: float | None) -> str:
    return "no p" if p is None else "p < 0.001" if p < 0.001 else f"p = {p_text(p)}"


@dataclass
class Comparison:
    a: str
    b: str
    tasks: list[TaskResult]  # the tasks with at least one pair
    unpaired: list[str]  # each run left out and why, one line each
    notes: list[str] = field(default_factory=list)  # conditions the pairs differ in
    interval: tuple[float, float] | None = None
    p: float | None = None
    left_out: int = 0  # task-and-seed cells left out, all tasks together

    @property
    def pairs(self) -> int:
        return sum(len(t.pairs) for t in self.tasks)

    @property
    def diff(self) -> float | None:
        return stats.mean_of_means([t.diffs for t in self.tasks]) if self.tasks else None

    @property
    def outcome(self) -> int:
        """+1: A beats B; -1: B beats A; 0: cannot tell."""
        return significant(self.diff, self.interval, self.p)

    def verdict(self) -> str:
        """One line: who beats whom, on how many tasks, and the overall figure."""
        if not self.tasks:
            return f"cannot compare {self.a} and {self.b}: no task and seed where both have a counted run"
        winner, loser, sign = (self.b, self.a, -1) if self.outcome < 0 else (self.a, self.b, 1)
        diff = sign * (self.diff or 0.0)
        ends = None if self.interval is None else (sign * self.interval[0], sign * self.interval[1])
        interval = None if ends is None else (min(ends), max(ends))
        ahead = sum(sign * t.diff > 0 for t in self.tasks)
        clearly = sum(significant(t.diff, t.interval, t.p) == sign for t in self.tasks)
        figure = f"overall {signed(diff)} {span(interval)}, {p_phrase(self.p)}"
        on = f"ahead on {ahead} of {len(self.tasks)} tasks (significantly on {clearly})"
        if self.outcome:
            return f"{winner} beats {loser}: {on}; {figure}"
        why = (
            "one pair: no interval"
            if self.interval is None
            else "the interval contains 0"
            if self.interval[0] <= 0 <= self.interval[1]
            else f"p >= {ALPHA:g}"
        )
        return f"cannot tell {self.a} from {self.b} ({why}): {self.a} {on}; {figure}"

    def table(self) -> Table:
        a, b = self.a, self.b
        headers = ["task", "pairs", "seeds unpaired", a, b, f"{a} − {b}", f"{LEVEL:.0%} interval", "p"]
        rows = [
            [
                t.task,
                str(len(t.pairs)),
                str(t.unpaired),
                f"{t.mean_a:.1f}",
                f"{t.mean_b:.1f}",
                signed(t.diff),
                span(t.interval),
                p_text(t.p),
            ]
            for t in self.tasks
        ]
        if self.tasks:
            rows.append(
                [
                    f"overall ({len(self.tasks)} tasks)",
                    str(self.pairs),
                    str(self.left_out),
                    f"{stats.mean_of_means([[p.value_a for p in t.pairs] for t in self.tasks]):.1f}",
                    f"{stats.mean_of_means([[p.value_b for p in t.pairs] for t in self.tasks]):.1f}",
                    signed(self.diff or 0.0),
                    span(self.interval),
                    p_text(self.p),
                ]
            )
        return Table(headers, rows)


COST_INTRO = (
    "Mean per attempt: the model API's dollars, the compute's (the hardware held, at the config's "
    "prices), their sum, and the GPU-hours held."
)


def cost_table(sides: dict[str, list[RunRow]]) -> Table | None:
    """What each side's runs cost, mean per attempt: the model API's dollars, the compute's (at the
    config's prices) and their sum, and the GPU-hours held; None when no run priced its compute."""
    attempts = {name: [r for r in rows if r.is_attempt] for name, rows in sides.items()}
    if not any(r.cost("compute") is not None for rows in attempts.values() for r in rows):
        return None
    headers = ["side", "attempts", *(f"{COST_NAMES[kind]} per run" for kind in COSTS), "GPU-hours per run"]
    body = []
    for name, rows in attempts.items():
        hours = mean(present(r.metric(Metric.GPU_HOURS) for r in rows))
        body.append(
            [
                name,
                str(len(rows)),
                *(dollars(mean(present(r.cost(kind) for r in rows))) for kind in COSTS),
                "-" if hours is None else f"{hours:.3g}",
            ]
        )
    return Table(headers, body)


def only_counted(side: str, runs: list[RunRow], label: str, seed: str) -> tuple[RunRow | None, str]:
    """The side's one counted run at this task and seed, or None and what became of its runs.
    Two counted runs are ambiguous: the user must narrow the runs."""
    counted = [r for r in runs if counted_value(r) is not None]
    if len(counted) > 1:
        differ = [
            f"{what} {', '.join(sorted({str(getattr(r, attr)) for r in counted}))}"
            for attr, what in DISTINCT
            if len({getattr(r, attr) for r in counted}) > 1
        ]
        raise CompareError(
            f"{side} has {len(counted)} counted runs of {label} with seed {seed} ({', '.join(sorted(r.name for r in counted))}"
            f"{'; they differ in ' + '; '.join(differ) if differ else ''}): narrow the runs with --budget, --scale, "
            "--sweep or --experiment, or name a model or a sweep"
        )
    if counted:
        return counted[0], ""
    if not runs:
        return None, "no run"
    left = next((r for r in runs if r.left_out), None)
    if left is not None:
        return None, left.left_out
    attempt = next((r for r in runs if r.is_attempt), None)
    if attempt is not None:
        return None, "no counted score (its task has no do-nothing anchor, or it was recorded before runs recorded one)"
    first = runs[0]
    return None, f"not counted ({KIND_LABELS.get(first.kind, first.kind)}: {first.detail or '-'})"


def compare(
    a: str,
    rows_a: Sequence[RunRow],
    b: str,
    rows_b: Sequence[RunRow],
    label: Callable[[tuple[str, str]], str],
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Comparison:
    """A against B, paired by task (and scale) and seed."""
    runs_a, runs_b = by_stratum_and_seed(rows_a), by_stratum_and_seed(rows_b)
    tasks: list[TaskResult] = []
    unpaired: list[str] = []
    left_out = 0
    for key in sorted(set(runs_a) | set(runs_b)):
        name = label(key)
        seeds_a, seeds_b = runs_a.get(key, {}), runs_b.get(key, {})
        if not seeds_a or not seeds_b:  # one side never ran this task: one line, not one per seed
            ran, other, seeds = (a, b, seeds_a) if seeds_a else (b, a, seeds_b)
            n = sum(len(runs) for runs in seeds.values())
            left_out += len(seeds)
            unpaired.append(
                f"{name}: only {ran} ran it ({n} runs, seeds {', '.join(sorted(seeds, key=seed_order))}); "
                f"{other} has none"
            )
            continue
        pairs, left = [], 0
        for s in sorted(set(seeds_a) | set(seeds_b), key=seed_order):
            run_a, why_a = only_counted(a, seeds_a.get(s, []), name, s)
            run_b, why_b = only_counted(b, seeds_b.get(s, []), name, s)
            value_a = None if run_a is None else counted_value(run_a)
            value_b = None if run_b is None else counted_value(run_b)
            if run_a is not None and run_b is not None and value_a is not None and value_b is not None:
                pairs.append(Pair(s, run_a, run_b, value_a, value_b))
                continue
            left += 1
            state_a = why_a if value_a is None else f"{value_a:.1f}"
            state_b = why_b if value_b is None else f"{value_b:.1f}"
            unpaired.append(f"{name} seed {s}: {a} {state_a}; {b} {state_b}")
        left_out += left
        if pairs:
            diffs = [p.diff for p in pairs]
            tasks.append(
                TaskResult(
                    name,
                    pairs,
                    left,
                    stats.bootstrap_interval([diffs], LEVEL, resamples, seed),
                    stats.sign_flip_p([diffs], seed=seed),
                )
            )
        else:
            unpaired.append(f"{name}: no seed where both {a} and {b} have a counted run")
    groups = [t.diffs for t in tasks]
    return Comparison(
        a,
        b,
        tasks,
        unpaired,
        condition_notes(a, b, tasks),
        interval=stats.bootstrap_interval(groups, LEVEL, resamples, seed) if tasks else None,
        p=stats.sign_flip_p(groups, seed=seed) if tasks else None,
        left_out=left_out,
    )


def condition_notes(a: str, b: str, tasks: Sequence[TaskResult]) -> list[str]:
    """The conditions the paired runs of A and B differ in (a budget, a sandbox...): what else the difference measures."""
    notes = []
    for attr in CONDITIONS:
        values_a = sorted({str(getattr(p.a, attr)) for t in tasks for p in t.pairs})
        values_b = sorted({str(getattr(p.b, attr)) for t in tasks for p in t.pairs})
        if values_a != values_b:
            notes.append(f"the pairs differ in {attr}: {a} {', '.join(values_a)}; {b} {', '.join(values_b)}")
    return notes


# ---- the answer, and whether flagged runs change it -------------------------------------------


def gist(c: Comparison, p: float | None) -> tuple[int, int]:
    """What the answer is: (significant: +1 A, -1 B, 0 cannot tell; ahead: +1 A, -1 B, 0 level), at P."""
    diff = c.diff or 0.0
    return significant(c.diff, c.interval, p), (diff > 0) - (diff < 0)


def answer(c: Comparison, p: float | None) -> str:
    """The answer in a few words, at P (the comparison's own, or Holm-adjusted): who beats whom, else
    who is ahead."""
    if not c.tasks:
        return "no pairs"
    beats, ahead = gist(c, p)
    if beats:
        return f"{c.a} beats {c.b}" if beats > 0 else f"{c.b} beats {c.a}"
    return (
        f"cannot tell ({c.a} ahead)"
        if ahead > 0
        else f"cannot tell ({c.b} ahead)"
        if ahead < 0
        else "cannot tell (level)"
    )


def change_line(scored: Answer, failed: Answer) -> str:
    """One line: whether an answer (who is ahead, and whether significantly) changes when flagged runs
    count as failures rather than as they scored; each pair of sides, at its Holm-adjusted p when ranked."""
    changed = []
    for one, other in zip(scored.comparisons, failed.comparisons, strict=True):
        p_one, p_other = scored.p_of(one), failed.p_of(other)
        if gist(one, p_one) != gist(other, p_other):
            pair = f"{one.a} vs {one.b}, " if len(scored.comparisons) > 1 else ""
            changed.append(f"{pair}{answer(one, p_one)} counted as they scored, {answer(other, p_other)} as failures")
    if not changed:
        return "The answer is the same when flagged runs count as failures."
    return "The answer changes when flagged runs count as failures: " + "; ".join(changed) + "."


@dataclass
class Answer:
    """The sides compared with their flagged runs counted one way (report/flagged.py's TREATMENTS)."""

    treatment: str
    comparisons: list[Comparison]  # one for two sides, every pair for more
    ranking: Ranking | None = None  # more than two sides

    def p_of(self, c: Comparison) -> float | None:
        """The p its verdict reads: Holm-adjusted when more than two sides are ranked."""
        return self.ranking.adjusted.get((c.a, c.b)) if self.ranking else c.p

    def verdict(self) -> str:
        return self.ranking.groups_line() if self.ranking else self.comparisons[0].verdict()


def answer_for(
    sides: dict[str, list[RunRow]],
    label: Callable[[tuple[str, str]], str],
    treatment: str,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Answer:
    """SIDES compared, their flagged runs counted as TREATMENT says."""
    treated = {name: flagged.treat(rows, treatment) for name, rows in sides.items()}
    if len(treated) == 2:
        (a, rows_a), (b, rows_b) = treated.items()
        return Answer(treatment, [compare(a, rows_a, b, rows_b, label, resamples, seed)])
    ranking = rank(treated, label, resamples, seed)
    return Answer(treatment, ranking.comparisons, ranking)


# ---- more than two sides -------------------------------------------------------------------


@dataclass
class Ranking:
    """Every pair of sides compared; the sides best first, and the groups no significant difference separates."""

    order: list[str]
    comparisons: list[Comparison]
    adjusted: dict[tuple[str, str], float]  # (a, b) -> its Holm-adjusted p
    groups: list[list[str]]

    def differ(self, x: str, y: str) -> bool:
        for c in self.comparisons:
            if {c.a, c.b} == {x, y}:
                p = self.adjusted.get((c.a, c.b))
                return significant(c.diff, c.interval, p) != 0
        return False

    def table(self) -> Table:
        headers = [
            "A",
            "B",
            "tasks",
            "pairs",
            "seeds unpaired",
            "A − B",
            f"{LEVEL:.0%} interval",
            "p",
            "p (Holm)",
            "verdict",
        ]
        rows = []
        for c in self.comparisons:
            adjusted = self.adjusted.get((c.a, c.b))
            outcome = significant(c.diff, c.interval, adjusted)
            verdict = f"{c.a} beats {c.b}" if outcome > 0 else f"{c.b} beats {c.a}" if outcome < 0 else "cannot tell"
            rows.append(
                [
                    c.a,
                    c.b,
                    str(len(c.tasks)),
                    str(c.pairs),
                    str(c.left_out),
                    "-" if c.diff is None else signed(c.diff),
                    span(c.interval),
                    p_text(c.p),
                    p_text(adjusted),
                    verdict,
                ]
            )
        return Table(headers, rows)

    def groups_line(self) -> str:
        shown = " ".join("[" + ", ".join(g) + "]" for g in self.groups)
        return f"statistically tied groups, best first: {shown}"


def rank(
    sides: dict[str, list[RunRow]], label: Callable[[tuple[str, str]], str], resamples: int = RESAMPLES, seed: int = 0
) -> Ranking:
    """Compare every pair of sides; order the sides by their mean difference against the others;
    group the neighbours in that order that no pair among them tells apart (Holm-adjusted)."""
    names = list(sides)
    comparisons = [compare(a, sides[a], b, sides[b], label, resamples, seed) for a, b in combinations(names, 2)]
    tested = {(c.a, c.b): c.p for c in comparisons if c.p is not None}
    adjusted = dict(zip(tested, stats.holm(list(tested.values())), strict=True))
    margins: dict[str, list[float]] = {n: [] for n in names}
    for c in comparisons:
        if c.diff is not None:
            margins[c.a].append(c.diff)
            margins[c.b].append(-c.diff)
    order = sorted(names, key=lambda n: -(sum(margins[n]) / len(margins[n]) if margins[n] else -math.inf))
    ranking = Ranking(order, comparisons, adjusted, [])
    reach = -1
    for i in range(len(order)):
        j = i
        while j + 1 < len(order) and not any(ranking.differ(order[k], order[j + 1]) for k in range(i, j + 1)):
            j += 1
        if j > reach:  # not inside the group before
            ranking.groups.append(order[i : j + 1])
            reach = j
    return ranking


# ---- in the report --------------------------------------------------------------------------

PAIRING = (
    "Runs of two agents pair when they ran the same task with the same seed; each pair gives a difference in "
    "counted normalised score (A − B; a failed attempt counts as doing nothing)."
)


def report_sides(rows: Sequence[RunRow]) -> dict[str, list[RunRow]]:
    """The report's sides: its agents, or an agent's models when it ran with several."""
    sides: dict[str, list[RunRow]] = {}
    for agent in sorted({r.agent for r in rows}):
        mine = [r for r in rows if r.agent == agent]
        models = sorted({r.model for r in mine})
        if len(models) > 1:
            sides.update({model or agent: [r for r in mine if r.model == model] for model in models})
        else:
            sides[agent] = mine
    return sides


def report_sections(
    rows: Sequence[RunRow], resamples: int = RESAMPLES, seed: int = 0
) -> list[tuple[str, str, Table | None]]:
    """The report's "Paired comparisons": per budget that two agents (or models) or more ran,
    as python -m mlrb.compare prints them, as (heading, intro, table) sections."""
    budgets = sorted({r.budget for r in rows})
    sections: list[tuple[str, str, Table | None]] = []
    for budget in budgets:
        chosen = [r for r in rows if r.budget == budget]
        sides = report_sides(chosen)
        if len(sides) < 2:
            continue
        heading = "Paired comparisons" + (f" (budget {budget})" if len(budgets) > 1 else "")
        names = " ".join(sides)
        command = f"python -m mlrb.compare {names}" + (f" --budget {budget}" if len(budgets) > 1 else "")
        label = stratum_labeller(chosen)
        treatments = [flagged.INCLUDE] + ([flagged.AS_FAILURE] if flagged.flagged(chosen) else [])
        try:
            answers = [answer_for(sides, label, t, resamples, seed) for t in treatments]
        except CompareError as e:
            sections.append((heading, f"Not compared: {e}.", None))
            continue
        first = answers[0]
        table: Table | None
        if first.ranking is not None:
            said, table = first.verdict() + " (p Holm-adjusted)", first.ranking.table()
        else:
            said, table = first.verdict(), first.comparisons[0].table() if first.comparisons[0].tasks else None
        intro = f"{PAIRING} Verdict: {said}."
        if len(answers) > 1:  # flagged runs: the verdict with them counted as failures, and whether it changes
            intro += (
                f" With flagged runs counted as failures ({flagged.counts(chosen)}): {answers[1].verdict()}. "
                f"{change_line(first, answers[1])}"
            )
        intro += f" `{command}` lists the runs left out. {METHOD}"
        sections.append((heading, intro, table))
        costs = cost_table(sides)
        if costs is not None:  # some run priced its compute: what each side cost beside what it scored
            sections.append((heading.replace("Paired comparisons", "Cost per side"), COST_INTRO, costs))
    return sections


# ---- planning seeds ------------------------------------------------------------------------


@dataclass
class Noise:
    """The run-to-run noise of one task: the SD of a paired difference, in normalised points."""

    task: str
    sd_diff: float | None
    source: str


def noise_of_runs(rows: Sequence[RunRow], label: Callable[[tuple[str, str]], str]) -> list[Noise]:
    """Per task, from each group's counted runs (runs that never pool: RunRow.group): their SD
    pooled over the groups, times sqrt(2), the SD of the difference of two independent runs."""
    groups: dict[tuple[str, str], dict[tuple, list[float]]] = {}
    for r in rows:
        value = counted_value(r)
        if value is not None:
            groups.setdefault((r.task, r.scale), {}).setdefault(r.group, []).append(value)
    found = []
    for key in sorted({(r.task, r.scale) for r in rows}):
        sd, n = stats.pooled_sd(list(groups.get(key, {}).values()))
        source = (
            f"per-seed scores ({n} counted runs in groups of 2 or more) × √2"
            if sd is not None
            else "fewer than 2 counted runs in any group"
        )
        found.append(Noise(label(key), None if sd is None else math.sqrt(2) * sd, source))
    return found


def noise_of_comparison(
    comparison: Comparison, rows: Sequence[RunRow], label: Callable[[tuple[str, str]], str]
) -> list[Noise]:
    """Per task, the SD of the paired differences where it has 2 pairs or more; else from the
    two sides' per-seed scores (`rows`: both sides' runs)."""
    by_task = {t.task: t for t in comparison.tasks}
    found = []
    for noise in noise_of_runs(rows, label):
        task = by_task.get(noise.task)
        sd = stats.sd(task.diffs) if task else None
        if sd is not None and task is not None:
            noise = Noise(
                noise.task, sd, f"paired differences {comparison.a} − {comparison.b} ({len(task.pairs)} pairs)"
            )
        found.append(noise)
    return found


def noise_of_calibration(calibration: dict, tasks: Sequence[str] = ()) -> list[Noise]:
    """Per task of a calibration file (benchmarks/calibration.json: each anchor's score at each
    seed), the baseline's and the reference's seed SD pooled, in normalised points
    (100 / (reference - baseline) per raw point), times sqrt(2)."""
    found = []
    for task, entry in sorted(calibration.items()):
        if tasks and task not in tasks:
            continue
        anchors = entry.get("anchors", {})
        base, ref = anchors.get("baseline", {}).get("mean"), anchors.get("reference", {}).get("mean")
        values = [anchors.get(name, {}).get("values") or [] for name in ("baseline", "reference")]
        sd, n = stats.pooled_sd(values)
        if base is None or ref is None or ref == base:
            found.append(Noise(task, None, "calibration: no baseline-to-reference scale"))
        elif sd is None:
            found.append(Noise(task, None, "calibration: its baseline and reference score the same at every seed"))
        else:
            seeds = max(len(v) for v in values)
            found.append(
                Noise(
                    task,
                    math.sqrt(2) * sd * 100 / abs(ref - base),
                    f"calibration: baseline and reference at {seeds} seeds × √2",
                )
            )
    return found


@dataclass
class Plan:
    effect: float
    noise: list[Noise]
    power: float = 0.8
    alpha: float = ALPHA

    @property
    def floor(self) -> int:
        """With fewer pairs than this, the sign-flip test cannot reach p < alpha."""
        return stats.fewest_pairs(self.alpha)

    def seeds(self, noise: Noise) -> int | None:
        if noise.sd_diff is None:
            return None
        return max(self.floor, stats.seeds_needed(noise.sd_diff, self.effect, self.alpha, self.power))

    @property
    def measured(self) -> list[Noise]:
        return [n for n in self.noise if n.sd_diff is not None]

    def overall(self) -> int | None:
        """Seeds per task for the mean over the tasks with measured noise, from the seeds' noise
        alone: its variance is sum(SD_t**2) / (tasks**2 * n), and twice that in the overall
        interval, which resamples seeds again within the tasks it draws."""
        sds = [n.sd_diff for n in self.noise if n.sd_diff is not None]
        if not sds:
            return None
        variance = 2 * sum(sd**2 for sd in sds) / len(sds) ** 2
        n = stats.seeds_needed(math.sqrt(variance), self.effect, self.alpha, self.power)
        return max(n, math.ceil(self.floor / len(sds)))

    def table(self) -> Table:
        rows = [
            [n.task, n.source, "-" if n.sd_diff is None else f"{n.sd_diff:.1f}", self.seeds_cell(n)] for n in self.noise
        ]
        return Table(["task", "noise from", "SD of a paired difference", "seeds per task"], rows)

    def seeds_cell(self, noise: Noise) -> str:
        """The seeds, and the formula's own figure when the floor raised it."""
        seeds = self.seeds(noise)
        if seeds is None or noise.sd_diff is None:
            return "-"
        formula = stats.seeds_needed(noise.sd_diff, self.effect, self.alpha, self.power)
        return str(seeds) if formula == seeds else f"{seeds} (formula: {formula})"

    def lines(self) -> list[str]:
        z = stats.z_sum(self.alpha, self.power)
        heading = (
            f"Seeds per task to detect a {self.effect:g}-point difference in {SCORE}, at {self.power:.0%} power, "
            f"two-sided alpha {self.alpha:g}:"
        )
        overall = self.overall()
        if overall is None:
            summary = "overall: no task has measured noise; run 2 seeds or more of each side first"
        else:
            summary = (
                f"overall: {overall} seeds per task detect a {self.effect:g}-point difference in the mean over "
                f"the {len(self.measured)} tasks with measured noise, its interval excluding 0 (which counts "
                "the seeds' noise twice: it resamples tasks, then seeds within them). From the seeds' noise "
                "alone: when the effect differs between tasks, the interval is wider by that spread, which "
                "more seeds do not shrink."
            )
        method = (
            f"Method: a paired test's normal approximation, n = ((z({1 - self.alpha / 2:g}) + z({self.power:g})) "
            f"× SD / effect)² = ({z:.2f} × SD / {self.effect:g})², rounded up; at least {self.floor}, the fewest "
            f"pairs with which the sign-flip test can reach p < {self.alpha:g}. '-': no noise measured."
        )
        return [heading, "", self.table().markdown(), "", summary, method]
