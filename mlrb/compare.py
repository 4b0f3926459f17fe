"""`python -m mlrb.compare A B`: is agent A better than B, by how much, and how sure are we;
`python -m mlrb.compare --plan --effect 10`: how many seeds per task a comparison needs.

The runs are read as `python -m mlrb.report` reads them (the same filters and store) and
scored as it scores them (the counted normalised score); the statistics are
mlrb/report/paired.py's. Bad input is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mlrb.report.cli import NoStore, ReportError, add_run_arguments, filters_of, read
from mlrb.report.flagged import AS_FAILURE, COUNTED, EXCLUDE, INCLUDE, TREATMENTS
from mlrb.report.paired import METHOD, RESAMPLES, SCORE, CompareError

# The tiny tasks' anchors at several seeds, as benchmarks/calibration.py measured them (benchmarks/
# calibration.json links here): inside the package, so --plan works without runs after `pip install .`.
CALIBRATION = Path(__file__).resolve().parent / "data" / "calibration.json"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mlrb.compare",
        description="Paired comparison of agents on the counted normalised score (a failed attempt counts as doing "
        "nothing): runs of A and B pair when they ran the same task with the same seed. Per task and overall: the "
        "mean difference A − B, a 95% bootstrap interval (seeds resampled within tasks; overall, tasks as "
        "clusters) and the p-value of a two-sided paired sign-flip permutation test; then one verdict line. More "
        "than two sides: every pair, Holm-adjusted, and the groups that are statistically tied. Runs that do not "
        "pair (a seed one side lacks, a run not counted) are listed. --plan: seeds per task to detect --effect "
        "points at 80% power (two-sided alpha 0.05, normal approximation), from the noise of the runs at hand, or "
        "of the tiny tasks' calibration (shipped with mlrb, measured by benchmarks/calibration.py) when there are none.",
        epilog="Examples: python -m mlrb.compare baseline claude --task llm_merging; "
        "python -m mlrb.compare --plan --effect 10",
    )
    p.add_argument(
        "sides",
        nargs="*",
        metavar="SIDE",
        help="two or more agents, models (agent.options.model) or sweep ids (tag mlrb.sweep_id)",
    )
    add_run_arguments(p, agents=False)
    statistics = p.add_argument_group("statistics")
    statistics.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the bootstrap and of random sign flips "
        "(the output is the same for the same runs and seed); default: 0",
    )
    statistics.add_argument(
        "--resamples", type=int, default=RESAMPLES, help=f"bootstrap resamples; default: {RESAMPLES}"
    )
    statistics.add_argument(
        "--flagged",
        default=None,
        metavar="|".join(TREATMENTS),
        help="how to count the runs their review flagged (suspicious or tampering): as they "
        "scored (include), as failed attempts, doing nothing (as-failure), or not at all, "
        "with the runs they pair with (exclude); default: each comparison both as they scored "
        "and as failures, and a line that says whether the answer changes",
    )
    plan = p.add_argument_group("planning seeds")
    plan.add_argument("--plan", action="store_true", help="say how many seeds per task a comparison needs")
    plan.add_argument(
        "--effect",
        type=float,
        default=None,
        metavar="POINTS",
        help="the difference to detect, in points of counted normalised score (100 = the baseline-to-reference gap)",
    )
    plan.add_argument("--power", type=float, default=0.8, help="the chance to detect it; default: 0.8")
    plan.add_argument(
        "--calibration",
        type=Path,
        default=CALIBRATION,
        metavar="PATH",
        help="the tasks' anchors at several seeds, used when there are no runs; default: the "
        "calibration shipped with mlrb (benchmarks/calibration.py writes it)",
    )
    return p


def check(args: argparse.Namespace) -> None:
    if args.plan:
        if args.effect is None:
            raise CompareError(
                "--plan needs --effect, the difference to detect in normalised points (e.g. --effect 10)"
            )
        if not args.effect > 0:
            raise CompareError(
                f"--effect must be a positive number of normalised points (e.g. 10); got {args.effect:g}"
            )
        if not 0 < args.power < 1:
            raise CompareError(f"--power must be between 0 and 1 (e.g. 0.8); got {args.power:g}")
        if len(args.sides) == 1:
            raise CompareError(f"--plan takes no side, or two or more to compare; got only '{args.sides[0]}'")
    else:
        if args.effect is not None:
            raise CompareError("--effect is for --plan: python -m mlrb.compare --plan --effect 10")
        if len(args.sides) < 2:
            given = f"got only '{args.sides[0]}'" if args.sides else "got none"
            raise CompareError(f"name two or more agents, models or sweep ids to compare (A B); {given}")
    if args.resamples < 100:
        raise CompareError(f"--resamples must be at least 100; got {args.resamples}")


def calibration_noise(path: Path, tasks: list[str], why: str) -> list:
    from mlrb.report.paired import noise_of_calibration

    if not path.is_file():
        raise CompareError(f"{why}, and no calibration file at {path} (pass --calibration PATH)")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CompareError(f"cannot read the calibration file {path}: {e}") from None
    unknown = [t for t in tasks if t not in data]
    if unknown:
        raise CompareError(f"no calibration of task '{unknown[0]}' in {path}; its tasks: {', '.join(sorted(data))}")
    print(f"Noise from {path} (tiny-scale anchors at several seeds): {why}.\n")
    return noise_of_calibration(data, tasks)


def plan_without_sides(args: argparse.Namespace) -> int:
    """Seeds per task from the runs at hand, or from the calibration file when there are none."""
    from mlrb.report.paired import Plan, noise_of_runs, stratum_labeller

    filters = filters_of(args)
    try:
        _, selection, shown_uri = read(args, filters)
        rows = selection.rows
    except NoStore as e:
        noise = calibration_noise(args.calibration, filters.tasks, str(e).split(" (")[0])
    else:
        if rows:
            print(f"Noise of the {len(rows)} runs at hand in {shown_uri} (filters: {filters.describe()}).\n")
            noise = noise_of_runs(rows, stratum_labeller(rows))
        else:
            why = f"no runs match (filters: {filters.describe()}) in {shown_uri}"
            noise = calibration_noise(args.calibration, filters.tasks, why)
    print("\n".join(Plan(args.effect, noise, args.power).lines()))
    return 0


def run(args: argparse.Namespace) -> int:
    from mlrb.report.paired import Plan, answer_for, change_line, noise_of_comparison, resolve, stratum_labeller

    check(args)
    if args.plan and not args.sides:
        return plan_without_sides(args)
    filters = filters_of(args)
    _, selection, shown_uri = read(args, filters)
    rows = selection.rows
    if not rows:
        raise CompareError(f"no runs match (filters: {filters.describe()}) in {shown_uri}")
    sides = resolve(rows, args.sides, f"the runs (filters: {filters.describe()})")
    chosen = [r for side in sides.values() for r in side]
    plumbing = sorted({f"{r.task} (scale {r.scale})" for r in chosen if r.plumbing})
    if plumbing:
        raise CompareError(
            f"runs at a plumbing scale measure nothing and are not compared: {', '.join(plumbing)}; "
            "compare runs at a calibrated scale (task.scale=tiny or full), or leave these out "
            "with --scale"
        )
    label = stratum_labeller(chosen)
    treatments = treatments_of(args.flagged, chosen)
    answers = [answer_for(sides, label, t, args.resamples, args.seed) for t in treatments]
    if len(sides) > 2:
        if all(c.diff is None for answer in answers for c in answer.comparisons):
            raise CompareError(f"no two of {', '.join(sides)} share a task and seed where both have a counted run")
        print(f"{', '.join(sides)}, every pair compared by task and seed: {SCORE}.\n")
        print(review_line(chosen, args.flagged, len(treatments)))
        for answer in answers:
            ranking = answer.ranking
            assert ranking is not None  # (more than two sides are ranked)
            print(treatment_heading(answer.treatment, len(treatments)), end="")
            for c in ranking.comparisons:
                show(c)
            print(ranking.table().markdown() + "\n")
            if len(treatments) > 1:
                print(f"Verdict, flagged runs {COUNTED[answer.treatment]}: {ranking.groups_line()}\n")
        print(
            f"{METHOD} With more than two sides, p is Holm-adjusted for the {len(answers[0].comparisons)} "
            "comparisons before the verdict.\n"
        )
        show_costs(sides)
        print(change_line(*answers) if len(answers) > 1 else answers[0].verdict())
        return 0
    (a, _), (b, _) = sides.items()
    if not any(answer.comparisons[0].tasks for answer in answers):
        comparison = answers[0].comparisons[0]
        raise CompareError(
            f"{comparison.verdict()} ({len(comparison.unpaired)} unpaired: "
            f"{comparison.unpaired[0] if comparison.unpaired else 'no runs'})"
        )
    print(f"{a} vs {b}, paired by task and seed: {SCORE}.\n")
    print(review_line(chosen, args.flagged, len(treatments)))
    for answer in answers:
        print(treatment_heading(answer.treatment, len(treatments)), end="")
        show(answer.comparisons[0])
        if len(treatments) > 1:
            print(f"Verdict, flagged runs {COUNTED[answer.treatment]}: {answer.verdict()}\n")
    show_costs(sides)
    print(f"{METHOD}\n")
    print(change_line(*answers) if len(answers) > 1 else answers[0].verdict())
    if args.plan:
        comparison = answers[0].comparisons[0]
        print()
        print("\n".join(Plan(args.effect, noise_of_comparison(comparison, chosen, label), args.power).lines()))
    return 0


def treatments_of(chosen_value: str | None, rows: list) -> list[str]:
    """The ways to count flagged runs: the one --flagged names; else, where a run is flagged, as they
    scored and as failures; else as they scored (there is nothing to count otherwise)."""
    from mlrb.report.flagged import flagged

    if chosen_value:
        return [chosen_value]
    return [INCLUDE, AS_FAILURE] if flagged(rows) else [INCLUDE]


def review_line(rows: list, chosen_value: str | None, ways: int) -> str:
    """What the runs' reviews flagged and how this comparison counts them; the runs not reviewed."""
    from mlrb.report.flagged import counts, review_notes

    notes = "".join(f" {note}" for note in review_notes(rows))
    found = counts(rows)
    if not found:
        return f"Review: no run compared was flagged.{notes}\n"
    if ways > 1:
        how = "each comparison is given with them counted as they scored, then as failures (--flagged picks one)"
    elif chosen_value == EXCLUDE:
        how = "left out (--flagged exclude), and so are the runs they pair with: the unpaired runs say which"
    else:
        how = f"{COUNTED[chosen_value or INCLUDE]} (--flagged {chosen_value or INCLUDE})"
    return f"Review: {found} (python -m mlrb.report lists them); {how}.{notes}\n"


def treatment_heading(treatment: str, ways: int) -> str:
    return f"Flagged runs {COUNTED[treatment]} (--flagged {treatment}):\n\n" if ways > 1 else ""


def show(comparison) -> None:
    """A comparison's table, what it left out and what else its pairs differ in."""
    c = comparison
    print(f"{c.a} − {c.b}:" if c.tasks else f"{c.a} − {c.b}: no pairs")
    if c.tasks:
        print(c.table().markdown())
    if c.unpaired:
        print(f"\nUnpaired, left out of the differences ({len(c.unpaired)}):")
        print("\n".join(f"- {line}" for line in c.unpaired))
    else:
        print("\nEvery run is paired.")
    for note in c.notes:
        print(f"Note: {note}.")
    print()


def show_costs(sides) -> None:
    """Where some run priced its compute: what each side cost per run, the API's and the compute's dollars."""
    from mlrb.report.paired import cost_table

    table = cost_table(sides)
    if table is not None:
        print("Cost per run (mean over each side's attempts; compute at the config's prices):")
        print(table.markdown() + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.flagged is not None and args.flagged not in TREATMENTS:  # a usage error, as argparse's: status 2
        print(
            f"mlrb.compare: error: unknown --flagged value '{args.flagged}'; valid values: {', '.join(TREATMENTS)}",
            file=sys.stderr,
        )
        sys.exit(2)
    try:
        sys.exit(run(args))
    except (ReportError, CompareError) as e:
        print(f"mlrb.compare: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
