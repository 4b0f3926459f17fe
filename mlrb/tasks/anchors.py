"""A task's anchors: the part that measures, when the task's assets are built, what its
anchor solutions score (`hidden/calibration.json`), and reads them back for counting and
normalisation: do_nothing (the floor a failed attempt counts as), baseline (0 on the
normalised scale) and reference (100).

Packaged tasks and task folders use the same part; what differs is in its fields. A packaged
task measures its three commands side by side, one run per core; a task folder measures its
baseline one seed after another (its code may use every core) and names its own files when
one fails (`failed`); a task may score more for the record (`for_the_record`) or measure the
anchors its own way (`measured_by`: llm_merging merges the adapters itself). benchmarks/
calibration.py runs more seeds with `score_seeds`. Nothing here imports torch unless scores
are taken side by side.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlrb.analysis import stats
from mlrb.core.tags import Metric
from mlrb.scoring.report import ScoreReport

if TYPE_CHECKING:
    from mlrb.tasks.judge import Judge
    from mlrb.tasks.solutions import Solutions

DEFAULT_SEEDS = 3
ANCHORS = ("do_nothing", "baseline", "reference")

# Runs `command` at `seed` in a fresh workspace at the given path; returns the workspace.
RunSolution = Callable[[str, Path, int], Path]
# Scores the submission at the given path, working in the given folder.
ScoreSubmission = Callable[[Path, Path], ScoreReport]


class AnchorFailed(RuntimeError):
    """An anchor's command failed at `seed` (`ran` False; `reason` is its error) or made an
    invalid submission (`ran` True; `reason` is why it is invalid)."""

    def __init__(self, command: str, seed: int, reason: str, ran: bool):
        shown = f"calibration: `{command}` made an invalid submission at seed {seed}: {reason}" if ran else reason
        super().__init__(shown)
        self.seed, self.reason, self.ran = seed, reason, ran


@dataclass(frozen=True)
class Anchors:
    # Each anchor's solution command (absent: the task measures that anchor another way, or not).
    commands: dict[str, str]
    # The seeds (0, 1, ...) each command runs at: the anchors are their means.
    seeds: int
    # Anchors the config states ("<anchor>_score": value or None): a stated one wins and is not measured...
    stated: dict[str, float | None]
    # ...except these, measured whatever is stated (do_nothing for the record; a folder's baseline,
    # which is also the check that the folder works).
    always_measured: tuple[str, ...] = ("do_nothing",)
    higher_is_better: bool = True
    # Runs at once: None, as many as there are cores (each scored on one torch thread).
    workers: int | None = None
    # Where the submission lies in a run's workspace.
    submission: str = "submission"
    task_name: str = ""
    # Scores measured at build for the record (the assets' folder -> {name: score}), before the anchors.
    for_the_record: Callable[[Path], dict[str, Any]] | None = None
    # The task's own measurement instead of the commands' ((assets' folder, scores for the record)
    # -> what calibration.json holds, which it writes).
    measured_by: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None
    # The error a failed anchor stops the build with (a folder's names its files); None: AnchorFailed.
    failed: Callable[[AnchorFailed], Exception] | None = None
    # Whether a build may take a calibration mlrb ships for these exact assets (`shipped_records`)
    # once its own seed-0 runs score as that calibration's did; False: measure every seed.
    use_shipped: bool = True

    def calibrate(
        self, out_dir: Path, solutions: Solutions, judge: Judge, key: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Measure the anchors on the built assets in out_dir (hidden/calibration.json): each
        command run by the solutions part (in a warm interpreter) and scored by the judge.
        Where mlrb ships calibrations of assets with this asset `key` (`shipped_records`: one per
        kind of machine measured), only seed 0 is run: when it scores to the last bit as one shipped
        calibration's seed 0 did, that calibration is taken (its seeds are what this machine and
        code would measure); otherwise the other seeds are run too, as without one."""
        records = self.shipped(key)

        def extra() -> dict[str, Any]:  # measured only when the anchors are
            return self.for_the_record(out_dir) if self.for_the_record else {}

        if self.measured_by:
            return self.measured_by(out_dir, extra())
        try:
            with solutions.warm() as warm:

                def run(command: str, workspace: Path, seed: int) -> Path:
                    return solutions.run(command, workspace, seed, warm)

                def score(submission: Path, work_dir: Path) -> ScoreReport:
                    return judge.score(submission, out_dir, work_dir)

                if records:
                    return self.measure_against(out_dir, records, run, score, extra)
                return self.measure(out_dir, run, score, extra())
        except AnchorFailed as e:
            if self.failed is None:
                raise
            raise self.failed(e) from None

    def shipped(self, key: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The shipped calibrations of assets with this key, if this part may take one."""
        if key is None or not self.use_shipped or self.measured_by:
            return []
        return shipped_records(self.task_name, key)

    def measure_against(
        self,
        out_dir: Path,
        records: list[dict[str, Any]],
        run: RunSolution,
        score: ScoreSubmission,
        extra: Callable[[], dict[str, Any]],
    ) -> dict[str, Any]:
        """Seed 0 of each anchor to measure, checked against the shipped calibrations `records`:
        the first that every anchor agrees with, written as hidden/calibration.json; where none
        does, the remaining seeds too, as `measure` would have measured them all."""
        todo = self.to_measure()
        scratch = out_dir / "calibration"
        first = self.score_seeds(scratch, [(anchor, 0) for anchor in reversed(todo)], run, score)
        for record in records:
            if all(agrees(first[anchor, 0], record, anchor) for anchor in todo):
                shutil.rmtree(scratch, ignore_errors=True)
                return self.write(out_dir, record)
        disagree = [anchor for anchor in todo if not agrees(first[anchor, 0], records[0], anchor)]
        logging.getLogger(__name__).warning(
            "%s: the calibration mlrb ships does not hold on this machine (seed 0 of %s scores otherwise%s); "
            "measuring all %d seeds here",
            self.task_name,
            ", ".join(disagree),
            "" if len(records) == 1 else f", and no other machine's of the {len(records) - 1} shipped fits",
            self.seeds,
        )
        rest = [(anchor, seed) for anchor in reversed(todo) for seed in range(1, self.seeds)]
        reports = {**first, **self.score_seeds(scratch, rest, run, score)}
        shutil.rmtree(scratch, ignore_errors=True)
        return self.write(out_dir, self.summarise(todo, reports, extra()))

    def to_measure(self) -> dict[str, str]:
        return {
            anchor: command
            for anchor, command in self.commands.items()
            if anchor in self.always_measured or self.stated.get(f"{anchor}_score") is None
        }

    def measure(
        self, out_dir: Path, run: RunSolution, score: ScoreSubmission, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Write hidden/calibration.json: for each anchor to measure, the mean score of its
        command's submissions over the seeds, with their SD and SEM and each seed's score
        (`<anchor>_seeds`), the mean of each report metric, and `extra` scores measured for
        the record (say the untouched base model's).

        Side by side, the reference (usually the longest) starts first and each run is scored
        as soon as it is done, in the order runs end, on one torch thread (`one_torch_thread`).
        A submission that holds the same bytes as one already scored (a command that no seed
        reaches, as copying the base model) takes that report: on one thread the scorer gives
        the same bytes the same score, and an lm-eval score is most of a tiny build's time after
        its runs. An invalid submission stops the build (AnchorFailed), except do_nothing's
        (doing nothing may well be invalid, say over a memory limit: that is recorded)."""
        todo = self.to_measure()
        scratch = out_dir / "calibration"
        jobs = [(anchor, seed) for anchor in reversed(todo) for seed in range(self.seeds)]
        reports = self.score_seeds(scratch, jobs, run, score)
        shutil.rmtree(scratch, ignore_errors=True)
        return self.write(out_dir, self.summarise(todo, reports, extra))

    def summarise(
        self, todo: dict[str, str], reports: dict[tuple[str, int], ScoreReport], extra: dict[str, Any] | None
    ) -> dict[str, Any]:
        """What hidden/calibration.json holds, from every (anchor, seed)'s report."""
        scores: dict[str, Any] = dict(extra or {})
        for anchor in todo:
            runs = [reports[anchor, seed] for seed in range(self.seeds)]
            invalid = [r.reason for r in runs if not r.valid]
            if invalid:  # (do_nothing only: any other anchor raised above)
                scores[f"{anchor}_invalid"] = invalid[0]
                continue
            scores.update(seed_statistics(anchor, [float(r.score) for r in runs if r.score is not None]))
            for key in runs[0].metrics:
                values = [r.metrics[key] for r in runs if isinstance(r.metrics.get(key), (int, float))]
                if len(values) == len(runs):
                    scores[f"{anchor}.{key}"] = sum(values) / len(values)
        scores["anchor_seeds"] = self.seeds
        return scores

    @staticmethod
    def write(out_dir: Path, scores: dict[str, Any]) -> dict[str, Any]:
        (out_dir / "hidden").mkdir(parents=True, exist_ok=True)
        (out_dir / "hidden" / "calibration.json").write_text(json.dumps(scores, indent=2))
        return scores

    def score_seeds(
        self,
        scratch: Path,
        jobs: list[tuple[str, int]],
        run: RunSolution,
        score: ScoreSubmission,
        workers: int | None = None,
        invalid_stops: bool = True,
    ) -> dict[tuple[str, int], ScoreReport]:
        """Run each (anchor, seed) of `jobs` in scratch/ANCHOR/seed-SEED and score it, side by side
        unless one worker (see `measure`); the reports. An invalid submission stops it
        (AnchorFailed), except do_nothing's, unless `invalid_stops` is False."""
        reports: dict[tuple[str, int], ScoreReport] = {}
        scored: dict[str, ScoreReport] = {}  # by the submission's contents_digest

        def folder(anchor: str, seed: int) -> Path:
            return scratch / anchor / f"seed-{seed}"

        workers = workers or self.workers or max(1, min(len(jobs), os.cpu_count() or 1))
        with contextlib.ExitStack() as side_by_side:
            finished: Iterator[tuple[tuple[str, int], Callable[[], Path]]]
            if workers == 1:  # each run when its workspace is asked for, in order
                finished = (
                    (job, functools.partial(run, self.commands[job[0]], folder(*job) / "workspace", job[1]))
                    for job in jobs
                )
            else:
                from concurrent.futures import ThreadPoolExecutor, as_completed  # only when building

                pool = side_by_side.enter_context(ThreadPoolExecutor(max_workers=workers))
                side_by_side.enter_context(one_torch_thread())
                started = {
                    pool.submit(run, self.commands[job[0]], folder(*job) / "workspace", job[1]): job for job in jobs
                }
                # Each scored as soon as its run is done: a short run that ends while a long one
                # still trains is scored then, not after it, so fewer scores are left at the end.
                finished = ((started[future], future.result) for future in as_completed(started))
            for (anchor, seed), result in finished:
                try:
                    done = result()
                except RuntimeError as e:
                    raise AnchorFailed(self.commands[anchor], seed, str(e), ran=False) from None
                digest = contents_digest(done / self.submission)
                report = scored.get(digest) if digest else None
                if report is None:
                    report = score(done / self.submission, folder(anchor, seed) / "scoring")
                    if digest:
                        scored[digest] = report
                reports[anchor, seed] = report
                if invalid_stops and not report.valid and anchor != "do_nothing":
                    raise AnchorFailed(self.commands[anchor], seed, report.reason, ran=True)
        return reports

    def read(self, assets: Path) -> dict[str, float | None]:
        """Do-nothing, baseline and reference scores for counting and normalisation, each
        measured anchor's SEM over its seeds beside it (`<anchor>_sem`); stated values win.
        A reference that does not beat the baseline gives no normalised score: reference None."""
        measured_file = assets / "hidden" / "calibration.json"
        measured = json.loads(measured_file.read_text()) if measured_file.exists() else {}
        anchors: dict[str, float | None] = {}
        for anchor in ANCHORS:
            stated = self.stated.get(f"{anchor}_score")
            anchors[f"{anchor}_score"] = stated if stated is not None else measured.get(f"{anchor}_score")
        for anchor in ("baseline", "reference"):  # a stated anchor has no SEM
            if self.stated.get(f"{anchor}_score") is None and measured.get(f"{anchor}_sem") is not None:
                anchors[f"{anchor}_sem"] = measured[f"{anchor}_sem"]
        problem = anchor_problem(anchors[Metric.BASELINE_SCORE], anchors[Metric.REFERENCE_SCORE], self.higher_is_better)
        if problem:  # a scale on which the reference does not beat the baseline means nothing
            logging.getLogger(__name__).warning("%s: no normalised score: %s", self.task_name, problem)
            anchors[Metric.REFERENCE_SCORE] = None
        return anchors


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Score on one thread at build: the scores are taken beside the anchors' runs, one per core,
    where more threads only contend with them (on 2 cores an anchor that scores in 5 s alone
    took 264 s beside two runs, and slowed them by as much), and on one thread a score cannot
    depend on the machine's core count. Restored afterwards."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# The calibration mlrb ships (benchmarks/calibration.py writes it; benchmarks/calibration.json links
# to it): per task, each anchor's scores over seeds and, under "built", the hidden/calibration.json
# of a build of its tiny assets at those seeds with the asset key it was built with; under
# "other_machines", the same measured on other kinds of machine, whose kernels score otherwise.
SHIPPED = Path(__file__).resolve().parents[1] / "data" / "calibration.json"
# What a shipped calibration need not match of an asset key: the code's digest (a change that moves
# no score is common; one that does is caught by seed 0's check) and the seeds a build measures at.
NOT_MATCHED = ("sources", "anchor_seeds", "shipped")


def record_key(key: dict[str, Any]) -> dict[str, Any]:
    """An asset key as a shipped calibration records it (JSON, less NOT_MATCHED)."""
    kept = {name: value for name, value in key.items() if name not in NOT_MATCHED}
    return json.loads(json.dumps(kept, sort_keys=True, default=str))


def shipped_records(task_name: str, key: dict[str, Any]) -> list[dict[str, Any]]:
    """The hidden/calibration.json files mlrb ships for the task's assets built with this asset key:
    the main machine's first, then other machines' (none: none shipped, or shipped for other
    assets). Each says where it was measured (`shipped`), which a build that takes it keeps."""
    entry = shipped_file().get(task_name, {})
    records = []
    for measurement in [entry, *entry.get("other_machines", [])]:
        built = measurement.get("built")
        if not built or built.get("key") != record_key(key):
            continue
        measured = measurement.get("measured", {})
        where = {name: measured.get(name) for name in ("commit", "date")}
        where["cpu"] = measured.get("machine", {}).get("cpu")
        checked = {"checked": "seed 0 of each anchor, here, scored as shipped"}
        records.append({**built["calibration"], "shipped": where | checked})
    return records


def shipped_file() -> dict[str, Any]:
    """SHIPPED, read once while it stays unchanged: a task's asset key asks for it at every
    ensure_assets, and a run asks for its key several times."""
    try:
        info = SHIPPED.stat()
    except FileNotFoundError:
        return {}
    return _read_json(str(SHIPPED), info.st_mtime_ns, info.st_size)


@functools.lru_cache(maxsize=4)
def _read_json(path: str, mtime_ns: int, size: int) -> dict[str, Any]:  # (mtime_ns, size): the cache's key
    return json.loads(Path(path).read_text())


def agrees(report: ScoreReport, record: dict[str, Any], anchor: str) -> bool:
    """Whether an anchor's seed-0 report is the shipped calibration's seed 0, to the last bit
    (an invalid do_nothing: invalid for the same reason)."""
    if not report.valid:
        return record.get(f"{anchor}_invalid") == report.reason
    seeds = record.get(f"{anchor}_seeds") or []
    return bool(seeds) and report.score is not None and float(report.score) == seeds[0]


def contents_digest(path: Path) -> str | None:
    """A digest of what a file, or a folder's files, hold (names and bytes); None when there is
    no file to read, as for a missing submission."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.relative_to(path).as_posix().encode() if file != path else b"")
        with open(file, "rb") as f:  # in chunks: a full-scale submission is gigabytes
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def seed_statistics(anchor: str, values: list[float]) -> dict[str, Any]:
    """An anchor's scores over seeds 0, 1, ...: `<anchor>_score` (their mean), `_sd` (the sample
    SD of one run, None from one seed), `_sem` (SD / sqrt(n)) and `_seeds` (each seed's)."""
    return {
        f"{anchor}_score": sum(values) / len(values),
        f"{anchor}_sd": stats.sd(values),
        f"{anchor}_sem": stats.sem(values),
        f"{anchor}_seeds": values,
    }


def anchor_problem(baseline: float | None, reference: float | None, higher_is_better: bool = True) -> str:
    """Why the normalised scale (0 = baseline, 100 = reference) cannot be used, or "": the
    reference must beat the baseline in the task's direction (a loss: be lower)."""
    if baseline is None or reference is None:
        return ""
    beats = reference > baseline if higher_is_better else reference < baseline
    if not beats:
        return f"the reference ({reference:.4g}) does not beat the baseline ({baseline:.4g})"
    return ""
