"""A lab's store: a PostgreSQL-backed MLflow server filled with thousands of runs recorded as the
harness records them, and how the report, `mlrb.compare`, `mlrb.sync` and the MLflow UI answer.

    MLRB_TEST_POSTGRES=postgresql://USER:PW@127.0.0.1:5432/postgres \\
        .venv/bin/python -m benchmarks.store_load [--sizes 100,1000,10000] [--fill-processes 4]
        [--templates SWEEP_DIR] [--work DIR] [--out benchmarks/store_load.json]

First two real runs at the tiny scale (a sweep of the default task with the `baseline` agent and the
`claude` agent against the project's scripted model server, tests/fake_llm_server.py): their run
folders are the templates (`--templates` reuses a sweep folder made so before). Then a tracking
server (`python -m mlrb.tracking serve`, on a database of its own made on $MLRB_TEST_POSTGRES's
server, dropped at the end unless `--keep`) is filled to each size in turn. Each new run is a run folder whose
record.jsonl is a template's lines with a new run id, name, seed, sweep and a varied score, its
files hard links to the template's, uploaded with mlrb.sync's `sync_run` (the exporter a live run
uses) by a few processes at once; every 100 runs are one sweep, with its parent run, as a sweep
records them. What the server stores of each run's artifacts is then linked to the same files, so
the disk holds one copy (the artifact bytes a run adds to a lab's store are said apart).

At each size it prints and records: the fill rate and the CPU the server's processes and
PostgreSQL's backends for its database used meanwhile, then the wall time of
`python -m mlrb.report --no-plots --no-log`, `python -m mlrb.compare baseline claude`,
`python -m mlrb.sync --all` over the run folders (all already in the store), and the MLflow UI's
runs view (the request its runs table makes: 100 runs of the experiment, newest first, and the
parents of those) and experiments list, each with the server's CPU. Targets: the report and
compare over 10,000 runs within 30 s. Writes `--out` with where and how it was measured.

Filling 10,000 runs takes most of an hour. `--copy-from N` reaches the sizes above N by copying the
first N runs inside PostgreSQL instead (`copy_runs`): each copy a run of its own in the store and in a
run folder of its own, so that `mlrb.sync --all` goes over as many folders as the store holds runs. `--keep --work DIR` keeps the filled store (its database,
and DIR with the run folders and store.json); a later run with the same `--work` measures that store
again without filling it (sizes from the runs it holds up; the fill figures are the kept ones), and
`--drop --work DIR` drops it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import results as results_page
from benchmarks.results import Section, commands, load, provenance_table, table

REPO = Path(__file__).resolve().parent.parent
POSTGRES = os.environ.get("MLRB_TEST_POSTGRES", "postgresql://mlrb:mlrb@127.0.0.1:5432/postgres")
MODEL_SERVER = REPO / "tests" / "fake_llm_server.py"
AGENTS = ("baseline", "claude")  # the template runs' agents: the two sides compared
SWEEP_SIZE = 100  # runs per sweep (each with its parent run)
TARGET_S = 30.0  # the report and compare over 10,000 runs
# The claude template's model turns: run the task's merge, then submit (as benchmarks/pictures.py's).
TURNS = [[["run_python", {"path": "merge.py", "args": '--data "$MLRB_DATA" --output submission', "timeout_s": 300}]],
         [["submit", {"summary": "merged"}]]]  # fmt: skip


def offline_env(**more: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
            **more}  # fmt: skip


def python(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env or offline_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"`python {' '.join(args)}` failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done


# -- the template runs ----------------------------------------------------------------------------


def make_templates(work: Path) -> Path:
    """A real sweep of the default task, agents baseline and claude (against the scripted model
    server): its folder, the sweep's own record beside its runs' folders."""
    sweep = work / "template-sweep"
    (work / "turns.json").write_text(json.dumps(TURNS))
    server = subprocess.Popen([sys.executable, str(MODEL_SERVER), str(work / "turns.json")], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert server.stdout is not None
        address = f"http://127.0.0.1:{server.stdout.readline().strip()}"
        python(["-m", "mlrb", "-m", f"agent={','.join(AGENTS)}", f"tracking.dir={work / 'template-mlruns'}",
                f"hydra.sweep.dir={sweep}"], work,
               offline_env(ANTHROPIC_API_KEY="sk-ant-store-load", ANTHROPIC_BASE_URL=address))  # fmt: skip
    finally:
        server.kill()
        server.wait()
    return sweep


@dataclass
class Template:
    folder: Path
    lines: list[dict]
    files: dict[str, str]  # file in the run folder -> where the store keeps it (its artifact path)

    @classmethod
    def of(cls, folder: Path) -> Template:
        from mlrb.store import record

        lines = record.read(folder)
        files: dict[str, str] = {}
        for line in lines:
            if line["kind"] != "artifact" or Path(line["file"]).is_absolute():
                continue
            source, under = folder / line["file"], Path(line["artifact_path"] or "")
            if line["is_dir"]:
                for path in sorted(p for p in source.rglob("*") if p.is_file()):
                    files[str(path.relative_to(folder))] = str(under / path.relative_to(source))
            elif source.is_file():
                files[line["file"]] = str(under / source.name)
        return cls(folder, lines, files)

    @property
    def artifact_bytes(self) -> int:
        return sum((self.folder / f).stat().st_size for f in self.files)


def templates(sweep: Path) -> tuple[Template, dict[str, Template]]:
    """(the sweep's parent, agent -> its run) of a template sweep's folder."""
    parent = Template.of(sweep)
    runs = {}
    for folder in sorted(p.parent for p in sweep.glob("*/record.jsonl")):
        template = Template.of(folder)
        runs[template.lines[0]["tags"]["mlrb.agent"]] = template
    missing = [a for a in AGENTS if a not in runs]
    if missing:
        raise SystemExit(f"{sweep}: no template run of agent {', '.join(missing)}; make them again without --templates")
    return parent, runs


def score_of(index: int, agent: str, metrics: dict[str, float]) -> dict[str, float]:
    """A varied score for run INDEX (claude a little ahead), and what follows from it, as the harness
    works it out from the anchors (counted: never below doing nothing)."""
    spread = int(hashlib.sha256(str(index).encode()).hexdigest()[:8], 16) / 0xFFFFFFFF  # 0..1, fixed per run
    score = 0.45 + 0.3 * spread + (0.02 if agent == "claude" else 0.0)
    baseline, reference = metrics["baseline_score"], metrics["reference_score"]
    counted = max(score, metrics["do_nothing_score"])
    normalised = 100 * (score - baseline) / (reference - baseline)
    improvement = (score - baseline) / abs(baseline)
    return {"score": score, "normalised_score": normalised, "counted_score": counted,
            "counted_normalised_score": 100 * (counted - baseline) / (reference - baseline),
            "improvement": improvement, "success": float(improvement > 0.1)}  # fmt: skip


def new_record(template: Template, run_id: str, name: str, tags: dict[str, str], params: dict[str, str],
               metrics: dict[str, float], store_uri: str) -> list[dict]:  # fmt: skip
    """The template's lines as another run's: its id, name and store, TAGS and PARAMS over the
    template's wherever it has them, METRICS over the final ones, each trace of this run's session."""
    now = time.time()
    shift = now - template.lines[-1]["t"]  # the run ends now
    lines = []
    for line in template.lines:
        line = {**line, "t": round(line["t"] + shift, 3)}
        match line["kind"]:
            case "opened":
                line.update(run_id=run_id, run_name=name, store={"uri": store_uri},
                            tags={**line["tags"], **tags, "mlrb.run_id": run_id})  # fmt: skip
            case "params":
                line["params"] = {**line["params"], **{k: v for k, v in params.items() if k in line["params"]}}
            case "tags":
                line["tags"] = {**line["tags"], **{k: v for k, v in tags.items() if k in line["tags"]}}
            case "metrics" if "score" in line["metrics"]:
                line["metrics"] = {**line["metrics"], **metrics}
            case "trace":
                line["trace"] = {**line["trace"], "session": run_id}
        lines.append(line)
    return lines


def write_run(template: Template, folder: Path, lines: list[dict]) -> None:
    """A run folder: its record, and the template's files as hard links."""
    extra = ["trajectory.jsonl"] if (template.folder / "trajectory.jsonl").is_file() else []
    for file in [*template.files, *extra]:
        target = folder / file
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            os.link(template.folder / file, target)
    text = "".join(json.dumps(line) + "\n" for line in lines)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "record.jsonl").write_text(text)


# -- filling the store (each fill process) -------------------------------------------------------

_client: Any = None
_plan: dict[str, Any] = {}


def start_filler(plan: dict[str, Any]) -> None:
    """A fill process: its own client of the server."""
    global _client
    from mlrb.core.config import TrackingConfig
    from mlrb.store import tracking

    _plan.update(plan)
    _client, _ = tracking.client_for(TrackingConfig(uri=plan["uri"]))


def fill_one(index: int, parent_id: str) -> tuple[float, str]:
    """Run INDEX written and uploaded: (seconds, the store's id of it)."""
    from mlrb import sync

    plan, started = _plan, time.monotonic()
    agent = AGENTS[index % len(AGENTS)]
    seed, sweep = index // len(AGENTS), sweep_id(index // SWEEP_SIZE)
    template: Template = plan["templates"][agent]
    run_id = uuid.uuid4().hex
    folder = Path(plan["outputs"]) / "runs" / f"{index:06d}_llm_merging_{agent}_{seed}"
    name = template.lines[0]["run_name"].rsplit("/", 1)[0] + f"/{seed}"
    tags = {"mlrb.seed": str(seed), "mlrb.sweep_id": sweep, "mlflow.parentRunId": parent_id,
            "mlrb.run_dir": str(folder), "mlrb.run_key": uuid.uuid4().hex[:16]}  # fmt: skip
    final = next(line["metrics"] for line in template.lines if line["kind"] == "metrics" and "score" in line["metrics"])
    lines = new_record(template, run_id, name, tags, {"seed": str(seed)}, score_of(index, agent, final), plan["uri"])
    write_run(template, folder, lines)
    said = sync.sync_run(_client, None, folder)
    store_id = said.rsplit(" ", 1)[-1].rstrip(")")
    link_stored_artifacts(template, folder, Path(plan["artifacts"]), store_id)
    return time.monotonic() - started, store_id


def link_stored_artifacts(template: Template, folder: Path, artifacts: Path, store_id: str) -> None:
    """The server's copies of the run's artifacts replaced by links to the same files: one copy on disk."""
    stored = next(artifacts.glob(f"*/{store_id}/artifacts"), None)
    if stored is None:
        return
    for file, kept_as in template.files.items():
        copy = stored / kept_as
        if copy.is_file() and not copy.samefile(folder / file):
            partial = copy.with_name(copy.name + ".linking")
            os.link(folder / file, partial)
            os.replace(partial, copy)


def sweep_id(number: int) -> str:
    return f"load{number:08d}"


# -- the server, and what it and PostgreSQL use ---------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def tracking_server(work: Path, workers: int | None, database: str | None = None, keep: bool = False,
                    plain: bool = False, port: int | None = None) -> Iterator[tuple[str, subprocess.Popen, str]]:  # fmt: skip
    """`python -m mlrb.tracking serve` (with `--plain` if PLAIN: MLflow's routes alone) on a database of
    its own (DATABASE if given; dropped after unless KEEP), on PORT if given: (URI, process, database)."""
    import psycopg

    database = database or f"mlrb_load_{uuid.uuid4().hex[:10]}"
    port = port or free_port()
    log = work / "server.log"
    command = [sys.executable, "-m", "mlrb.tracking", "serve", "--backend-store-uri",
               POSTGRES.rsplit("/", 1)[0] + f"/{database}", "--artifacts-destination", str(work / "artifacts"),
               "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    if workers:
        command += ["--workers", str(workers)]
    if plain:
        command.append("--plain")
    with open(log, "a") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=work, env=offline_env())
    try:
        deadline = time.monotonic() + 300
        while f"MLFLOW_TRACKING_URI=http://127.0.0.1:{port}" not in log.read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the tracking server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", server, database
    finally:
        server.terminate()
        server.wait(timeout=60)
        if not keep:
            with psycopg.connect(POSTGRES, autocommit=True) as connection:
                connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


# -- a store kept for another measurement (--keep) --------------------------------------------------


def kept_store(work: Path | None) -> dict[str, Any] | None:
    """What --keep left in WORK (store.json): the database, its runs, its sweeps' parents, its fills."""
    if work is None or not (work / KEPT).is_file():
        return None
    return json.loads((work / KEPT).read_text())


def keep_store(work: Path, database: str, port: int, runs: int, parents: dict[int, str], sweep: Path,
               fills: dict[str, Any]) -> None:  # fmt: skip
    """The store's port is kept too: its run folders' records name the server's URI (mlrb.sync reads it)."""
    kept = {"database": database, "port": port, "runs": runs, "parents": {str(k): v for k, v in parents.items()},
            "templates": str(sweep), "fills": fills}  # fmt: skip
    (work / KEPT).write_text(json.dumps(kept, indent=2) + "\n")


def drop_kept_store(work: Path) -> None:
    """--drop: the kept store's database dropped and its work folder removed."""
    import psycopg

    kept = kept_store(work)
    if kept is None:
        raise SystemExit(f"--drop: {work} holds no kept store ({KEPT}); nothing to drop")
    with psycopg.connect(POSTGRES, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{kept["database"]}" WITH (FORCE)')
    shutil.rmtree(work)
    print(f"dropped database {kept['database']} and removed {work}")


KEPT = "store.json"


class CpuMeter:
    """CPU seconds of the server's process tree and of PostgreSQL's processes that serve its database,
    sampled while a block runs (a process that starts and ends between two samples is missed)."""

    def __init__(self, server_pid: int, database: str):
        self.server_pid, self.database = server_pid, database

    def processes(self) -> Iterator[tuple[str, Any]]:
        import psutil  # type: ignore[import-untyped]

        try:
            server = psutil.Process(self.server_pid)
            for process in [server, *server.children(recursive=True)]:
                yield "server", process
        except psutil.NoSuchProcess:
            pass
        for process in psutil.process_iter(["name", "cmdline"]):
            if process.info["name"] == "postgres" and self.database in " ".join(process.info["cmdline"] or []):
                yield "postgres", process

    def sample(self, seen: dict[tuple, tuple[str, float]]) -> None:
        import psutil  # type: ignore[import-untyped]

        for role, process in list(self.processes()):
            try:
                times = process.cpu_times()
                seen[(process.pid, process.create_time())] = (role, times.user + times.system)
            except psutil.Error:
                pass

    @contextlib.contextmanager
    def measure(self) -> Iterator[dict[str, float]]:
        """Yields a dict filled on exit: wall_s, server_cpu_s, postgres_cpu_s."""
        before: dict[tuple, tuple[str, float]] = {}
        self.sample(before)
        seen = dict(before)
        done = threading.Event()

        def sampler() -> None:
            while not done.wait(0.5):
                self.sample(seen)

        thread = threading.Thread(target=sampler, daemon=True)
        figures: dict[str, float] = {}
        started = time.monotonic()
        thread.start()
        try:
            yield figures
        finally:
            done.set()
            thread.join()
            self.sample(seen)
            figures["wall_s"] = round(time.monotonic() - started, 3)
            for role in ("server", "postgres"):
                used = sum(cpu - before.get(key, (role, 0.0))[1] for key, (r, cpu) in seen.items() if r == role)
                figures[f"{role}_cpu_s"] = round(used, 2)


def database_mib(database: str) -> float:
    import psycopg

    with psycopg.connect(POSTGRES) as connection:
        size = connection.execute("SELECT pg_database_size(%s)", (database,)).fetchone()
    return round(size[0] / 2**20, 1) if size else 0.0


# -- what is timed at each size --------------------------------------------------------------------


def timed_command(meter: CpuMeter, args: list[str], cwd: Path) -> dict[str, Any]:
    with meter.measure() as figures:
        done = python(args, cwd)
    lines = done.stdout.strip().splitlines()
    figures["output_tail"] = lines[-1:]
    figures["lines"] = len(lines)
    if "mlrb.sync" in args:  # each run folder's line: in sync, or what it uploaded
        figures["in_sync"] = sum(": in sync, nothing to upload" in line for line in lines)
    return figures


def ui_views(meter: CpuMeter, uri: str, experiment_id: str) -> dict[str, dict]:
    """The MLflow UI's requests for an experiment's runs table and for the experiments list."""

    def ask(path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{uri}/{path}", data=data, headers={"Content-Type": "application/json"},
                                         method="POST" if data else "GET")  # fmt: skip
        with urllib.request.urlopen(request, timeout=600) as answer:
            return json.loads(answer.read() or b"{}")

    with meter.measure() as runs_view:
        page = ask("ajax-api/2.0/mlflow/runs/search", {"experiment_ids": [experiment_id], "filter": "",
                   "run_view_type": "ACTIVE_ONLY", "max_results": 100, "order_by": ["attributes.start_time DESC"]})  # fmt: skip
        shown = {run["info"]["run_id"] for run in page.get("runs", [])}
        parents = {tag["value"] for run in page.get("runs", []) for tag in run["data"].get("tags", [])
                   if tag["key"] == "mlflow.parentRunId" and tag["value"] not in shown}  # fmt: skip
        if parents:  # the UI fetches the parents of the page's runs that are not on it
            ask("ajax-api/2.0/mlflow/runs/search", {"experiment_ids": [experiment_id], "run_view_type": "ALL",
                "filter": f"run_id IN ({','.join(repr(p) for p in sorted(parents))})"})  # fmt: skip
    runs_view["runs_shown"] = len(page.get("runs", []))
    with meter.measure() as experiments_view:
        ask("ajax-api/2.0/mlflow/experiments/search?max_results=1000")
    return {"runs_view": runs_view, "experiments_list": experiments_view}


def report_and_compare(meter: CpuMeter, uri: str, work: Path) -> dict[str, Any]:
    store = ["--tracking-uri", uri]
    return {
        "report": timed_command(
            meter, ["-m", "mlrb.report", "--no-plots", "--no-log", "--out", str(work / "report"), *store], work
        ),  # fmt: skip
        "compare": timed_command(meter, ["-m", "mlrb.compare", *AGENTS, *store], work),
    }


def on_plain_server(work: Path, workers: int | None, database: str) -> dict[str, Any]:
    """The report and compare against the same store served with `--plain` (MLflow's routes alone, as a
    lab's own MLflow server: every run read whole through MLflow's search)."""
    with tracking_server(work, workers, database, keep=True, plain=True) as (uri, server, _):
        return report_and_compare(CpuMeter(server.pid, database), uri, work)


def measure_size(meter: CpuMeter, uri: str, work: Path, experiment_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        **report_and_compare(meter, uri, work),
        "sync_all": timed_command(meter, ["-m", "mlrb.sync", "--all", "--outputs", str(work / "outputs")], work),
    }
    out.update(ui_views(meter, uri, experiment_id))
    return out


def fill(meter: CpuMeter, pool: ProcessPoolExecutor, client: Any, start: int, stop: int, parents: dict[int, str],
         plan: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Runs START..STOP-1 into the store; their sweeps' parent runs first."""
    from mlrb import sync

    with meter.measure() as figures:
        for number in range(start // SWEEP_SIZE, (stop - 1) // SWEEP_SIZE + 1):
            if number not in parents:
                parents[number] = upload_parent(client, sync, plan, number)
        seconds = list(pool.map(fill_one, range(start, stop), [parents[i // SWEEP_SIZE] for i in range(start, stop)],
                                chunksize=4))  # fmt: skip
    runs = stop - start
    figures.update(runs=runs, runs_per_s=round(runs / figures["wall_s"], 2),
                   median_upload_s=round(sorted(s for s, _ in seconds)[len(seconds) // 2], 3),
                   server_cpu_ms_per_run=round(1000 * figures["server_cpu_s"] / runs, 1),
                   postgres_cpu_ms_per_run=round(1000 * figures["postgres_cpu_s"] / runs, 1))  # fmt: skip
    return figures


# -- a size reached by copying runs inside PostgreSQL (--copy-from) -----------------------------------


def copy_runs(meter: CpuMeter, client: Any, database: str, start: int, stop: int, originals: int,
              parents: dict[int, str], plan: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Runs START..STOP-1 as copies of the first ORIGINALS runs filled: run i is run i % ORIGINALS under
    its own ids (store id, own id, run key), name, seed, sweep and run folder; the rows MLflow keeps of
    the run (runs, tags, params, metrics, latest metrics) copied in PostgreSQL, not through the server;
    its folder a record (the original's lines under the new ids) beside hard links to the original's
    files. The store's run is tagged with the new record's digest, as mlrb.sync tags a run it holds
    whole. The copies' traces are not copied (nothing timed reads them of a run in sync). Their sweeps'
    parent runs are uploaded as the fill uploads them."""
    import psycopg

    from mlrb import sync
    from mlrb.core.tags import Tag
    from mlrb.store import record

    runs_folder = Path(plan["outputs"]) / "runs"
    originals_of = {int(p.name[:6]): p for p in runs_folder.glob("*_llm_merging_*") if int(p.name[:6]) < originals}
    read: dict[int, Template] = {}
    with meter.measure() as figures:
        for number in range(start // SWEEP_SIZE, (stop - 1) // SWEEP_SIZE + 1):
            if number not in parents:
                parents[number] = upload_parent(client, sync, plan, number)
        with psycopg.connect(POSTGRES.rsplit("/", 1)[0] + f"/{database}") as connection:
            store_ids = dict(connection.execute("SELECT value, run_uuid FROM tags WHERE key = %s", (Tag.RUN_ID,)))
            for index in range(start, stop):
                source = index % originals
                template = read.get(source) or read.setdefault(source, Template.of(originals_of[source]))
                agent = template.lines[0]["tags"]["mlrb.agent"]
                seed, sweep, run_id = index // len(AGENTS), sweep_id(index // SWEEP_SIZE), uuid.uuid4().hex
                folder = runs_folder / f"{index:06d}_llm_merging_{agent}_{seed}"
                name = template.lines[0]["run_name"].rsplit("/", 1)[0] + f"/{seed}"
                tags = {"mlrb.seed": str(seed), Tag.SWEEP_ID: sweep, "mlflow.parentRunId": parents[index // SWEEP_SIZE],
                        Tag.RUN_DIR: str(folder), Tag.RUN_KEY: uuid.uuid4().hex[:16]}  # fmt: skip
                lines = new_record(template, run_id, name, tags, {"seed": str(seed)}, {}, plan["uri"])
                write_run(template, folder, lines)
                tags |= {Tag.RUN_ID: run_id, "mlflow.runName": name,
                         Tag.SYNCED_RECORD: sync.record_digest(folder, record.fold(lines))}  # fmt: skip
                copy_rows(connection, store_ids[template.lines[0]["run_id"]], uuid.uuid4().hex, name, tags, seed)
    runs = stop - start
    figures.update(runs=runs, runs_per_s=round(runs / figures["wall_s"], 2), copied_from=originals)
    return figures


def copy_rows(connection: Any, old: str, new: str, name: str, tags: dict[str, str], seed: int) -> None:
    """Run OLD's rows in MLflow's tables as run NEW's, with its NAME, TAGS over OLD's and its seed."""
    connection.execute(
        "INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, user_id, status, start_time, "
        "end_time, source_version, lifecycle_stage, artifact_uri, experiment_id, deleted_time) "
        "SELECT %s, %s, source_type, source_name, entry_point_name, user_id, status, start_time, end_time, "
        "source_version, lifecycle_stage, replace(artifact_uri, %s, %s), experiment_id, deleted_time "
        "FROM runs WHERE run_uuid = %s",
        (new, name, old, new, old),
    )
    connection.execute("INSERT INTO tags (key, value, run_uuid) SELECT key, value, %s FROM tags "
                       "WHERE run_uuid = %s AND NOT key = ANY(%s)", (new, old, list(tags)))  # fmt: skip
    with connection.cursor() as cursor:
        cursor.executemany("INSERT INTO tags (key, value, run_uuid) VALUES (%s, %s, %s)",
                           [(key, value, new) for key, value in tags.items()])  # fmt: skip
    connection.execute("INSERT INTO params (key, value, run_uuid) SELECT key, CASE WHEN key = 'seed' THEN %s "
                       "ELSE value END, %s FROM params WHERE run_uuid = %s", (str(seed), new, old))  # fmt: skip
    for table_ in ("metrics", "latest_metrics"):
        columns = "key, value, timestamp, step, is_nan"
        connection.execute(f"INSERT INTO {table_} ({columns}, run_uuid) SELECT {columns}, %s FROM {table_} "
                           "WHERE run_uuid = %s", (new, old))  # fmt: skip


def upload_parent(client: Any, sync: Any, plan: dict[str, Any], number: int) -> str:
    """Sweep NUMBER's parent run, written from the template's and uploaded: its id in the store."""
    from mlrb.store import tracking

    template: Template = plan["parent"]
    run_id = uuid.uuid4().hex
    folder = Path(plan["outputs"]) / "sweeps" / sweep_id(number)
    tags = {"mlrb.sweep_id": sweep_id(number), "mlrb.run_dir": str(folder), "mlrb.n_jobs": str(SWEEP_SIZE)}
    name = f"sweep llm_merging/smoke: agent={','.join(AGENTS)} seed=... ({sweep_id(number)})"
    write_run(template, folder, new_record(template, run_id, name, tags, {}, {}, plan["uri"]))
    sync.sync_run(client, None, folder)
    return tracking.find_run(client, run_id).info.run_id


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000,10000", help="store sizes in runs, in order (comma-separated)")
    parser.add_argument("--fill-processes", type=int, default=4, help="processes uploading runs at once")
    parser.add_argument("--server-workers", type=int, default=None, help="the server's workers (MLflow's default)")
    parser.add_argument("--templates", type=Path, default=None, help="a template sweep's folder made before")
    parser.add_argument("--work", type=Path, default=None, help="work here (kept) rather than in a temporary folder")
    parser.add_argument("--keep", action="store_true",
                        help="keep the filled store (its database and --work) for a later run with the same --work, "
                        "which measures it again without filling it again (sizes from the runs it holds up)")  # fmt: skip
    parser.add_argument("--drop", action="store_true", help="drop the store kept in --work, and the folder; then end")
    parser.add_argument("--also-plain", action="store_true",
                        help="at each size, also time the report and compare against the store served with --plain "
                        "(MLflow's routes alone, as a lab's own MLflow server)")  # fmt: skip
    parser.add_argument("--copy-from", type=int, default=None,
                        help="reach sizes above this many filled runs by copying them inside PostgreSQL (each "
                        "copy a run of its own, with its own run folder): a fill of 10,000 runs takes hours")  # fmt: skip
    parser.add_argument("--note", default=None, help="a note stored with the figures")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "store_load.json",
                        help="write the figures here (JSON) and benchmarks/RESULTS.md from it")  # fmt: skip
    args = parser.parse_args()
    if (args.keep or args.drop) and args.work is None:
        raise SystemExit(f"--{'keep' if args.keep else 'drop'}: give --work DIR, the folder the kept store lives in")
    if args.drop:
        return drop_kept_store(args.work)
    sizes = [int(s) for s in args.sizes.split(",")]
    if sizes != sorted(sizes) or sizes[0] < 1:
        raise SystemExit(f"--sizes {args.sizes}: give growing positive sizes, e.g. 100,1000,10000")
    kept = kept_store(args.work)
    if kept and sizes[0] < kept["runs"]:
        raise SystemExit(f"--sizes {args.sizes}: the store kept in {args.work} holds {kept['runs']} runs; give sizes "
                         f"from {kept['runs']} up, or drop it first (--drop)")  # fmt: skip
    keeping = args.keep or kept is not None
    measured = results_page.provenance(sources=SECTION.sources, note=args.note)

    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mlrb-store-load-")))
        work.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        sweep = args.templates or (Path(kept["templates"]) if kept else make_templates(work))
        template_s = time.monotonic() - started
        parent, runs = templates(sweep)
        uri, server, database = stack.enter_context(
            tracking_server(
                work,
                args.server_workers,
                kept["database"] if kept else None,
                keep=keeping,
                port=kept.get("port") if kept else None,
            )
        )
        meter = CpuMeter(server.pid, database)
        plan = {"uri": uri, "templates": runs, "parent": parent, "outputs": str(work / "outputs"),
                "artifacts": str(work / "artifacts")}  # fmt: skip
        from mlrb.core.config import TrackingConfig
        from mlrb.store import tracking

        client, _ = tracking.client_for(TrackingConfig(uri=uri))
        pool = stack.enter_context(ProcessPoolExecutor(args.fill_processes, initializer=start_filler, initargs=(plan,)))
        held = f", kept with {kept['runs']} runs" if kept else ""
        print(f"Store: {uri} on PostgreSQL (database {database}{held}); template runs "
              f"{'from ' + str(sweep) if args.templates or kept else f'made in {template_s:.0f} s'}; "
              f"{args.fill_processes} fill processes, {os.cpu_count()} CPUs", flush=True)  # fmt: skip
        figures: dict[str, Any] = {}
        parents = {int(k): v for k, v in kept["parents"].items()} if kept else {}
        fills: dict[str, Any] = dict(kept["fills"]) if kept else {}
        done = kept["runs"] if kept else 0
        for size in sizes:
            if size > done and args.copy_from and done >= args.copy_from:
                fills[str(size)] = copy_runs(meter, client, database, done, size, args.copy_from, parents, plan)
                done = size
                if keeping:
                    keep_store(work, database, int(uri.rsplit(":", 1)[1]), done, parents, sweep, fills)
            elif size > done:  # a kept store's size measured again keeps the figures of its fill
                fills[str(size)] = fill(meter, pool, client, done, size, parents, plan)
                done = size
                if keeping:
                    keep_store(work, database, int(uri.rsplit(":", 1)[1]), done, parents, sweep, fills)
            experiment_id = tracking.experiment_id(client, "llm_merging", None)
            answers = measure_size(meter, uri, work, experiment_id)
            figures[str(size)] = {"fill": fills[str(size)], **answers, "database_mib": database_mib(database)}
            if args.also_plain:
                figures[str(size)]["plain_server"] = on_plain_server(work, args.server_workers, database)
            show(size, figures[str(size)])
        result = {
            "measured": measured,
            "fill_processes": args.fill_processes,
            "server_workers": args.server_workers,
            "sweep_size": SWEEP_SIZE,
            "artifact_kib_per_run": {a: round(t.artifact_bytes / 1024, 1) for a, t in runs.items()},
            "record_lines_per_run": {a: len(t.lines) for a, t in runs.items()},
            "sizes": figures,
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {results_page.update(args.out)}", file=sys.stderr)
        if args.work:
            shutil.rmtree(work / "report", ignore_errors=True)


def show(size: int, figures: dict[str, Any]) -> None:
    fill_ = figures["fill"]
    print(f"\n{size} runs in the store (database {figures['database_mib']:.0f} MiB):")
    if fill_.get("copied_from"):
        print(f"  {fill_['runs']} runs copied from the first {fill_['copied_from']} in {fill_['wall_s']:.1f} s")
    else:
        print(f"  fill: {fill_['runs']} runs in {fill_['wall_s']:.1f} s, {fill_['runs_per_s']:.1f} runs/s "
              f"(median {fill_['median_upload_s']:.2f} s a run); server CPU {fill_['server_cpu_ms_per_run']:.0f} ms "
              f"a run, PostgreSQL {fill_['postgres_cpu_ms_per_run']:.0f} ms a run")  # fmt: skip
    for key, label in LABELS.items():
        f = figures[key]
        print(f"  {label:42s} {f['wall_s']:7.2f} s   server CPU {f['server_cpu_s']:6.2f} s, "
              f"PostgreSQL {f['postgres_cpu_s']:6.2f} s")  # fmt: skip
    for key, f in figures.get("plain_server", {}).items():
        label = f"{LABELS[key]} (--plain)"
        print(f"  {label:42s} {f['wall_s']:7.2f} s   server CPU {f['server_cpu_s']:6.2f} s, "
              f"PostgreSQL {f['postgres_cpu_s']:6.2f} s")  # fmt: skip
    sys.stdout.flush()


LABELS = {
    "report": "python -m mlrb.report --no-plots --no-log",
    "compare": "python -m mlrb.compare baseline claude",
    "sync_all": "python -m mlrb.sync --all",
    "runs_view": "MLflow UI: an experiment's runs table",
    "experiments_list": "MLflow UI: the experiments list",
}


# -- its section of the results page (benchmarks/results.py) -----------------------------------


def store_section(bench_dir: Path) -> str:
    data = load(bench_dir, "store_load.json")
    sizes = data["sizes"]
    header = ["", *(f"{int(size):,} runs" for size in sizes)]
    rows = [["fill rate (runs uploaded a second)",
             *(copied(f) or f"{f['fill']['runs_per_s']:.1f}" for f in sizes.values())],
            ["server's CPU per run uploaded: its processes + PostgreSQL's",
             *(copied(f) or f"{f['fill']['server_cpu_ms_per_run']:.0f} + {f['fill']['postgres_cpu_ms_per_run']:.0f} ms"
               for f in sizes.values())],
            ["database size", *(f"{f['database_mib']:,.0f} MiB" for f in sizes.values())]]  # fmt: skip
    rows += [[f"`{label}`" + (" (every run in sync)" if key == "sync_all" else "") if key in COMMANDS else label,
              *(seconds(f[key]["wall_s"]) for f in sizes.values())] for key, label in LABELS.items()]  # fmt: skip
    if all("plain_server" in f for f in sizes.values()):  # the same store served with --plain
        rows += [[f"`{LABELS[key]}`, the server started with `--plain`",
                  *(seconds(f["plain_server"][key]["wall_s"]) for f in sizes.values())] for key in PLAIN]  # fmt: skip
    artifacts = " and ".join(f"{kib / 1024:.1f} MiB ({agent})" for agent, kib in data["artifact_kib_per_run"].items())
    parts = [
        "A lab records its sweeps into one tracking server. `benchmarks/store_load.py` fills a PostgreSQL-backed "
        "server (`python -m mlrb.tracking serve`) with runs recorded as the harness records them: two real "
        "tiny-scale runs (the `baseline` agent and the `claude` agent against a scripted model) copied with new "
        f"ids, seeds and scores, each uploaded by `mlrb.sync`'s exporter, {data['fill_processes']} at a time, "
        f"{data['sweep_size']} runs to a sweep. At each size it times what a researcher then asks of the store; "
        "`mlrb.sync --all` finds every run already there. The target: the report and `mlrb.compare` within "
        f"{TARGET_S:.0f} s over 10,000 runs. Each run adds {artifacts} of artifacts to the artifact store.",
        commands("-m benchmarks.store_load"),
        "Output: `benchmarks/store_load.json`.",
        table(header, rows),
    ]
    largest = sizes[max(sizes, key=int)]
    verdict = [f"Over {int(max(sizes, key=int)):,} runs the report took {largest['report']['wall_s']:.0f} s and "
               f"`mlrb.compare` {largest['compare']['wall_s']:.0f} s: "
               + ("within the target." if max(largest["report"]["wall_s"], largest["compare"]["wall_s"]) <= TARGET_S
                  else f"over the target of {TARGET_S:.0f} s."),
               "Both read the runs through mlrb's run search on the server: straight from its database, with "
               "only the three params they read of a run's hundred and more."]  # fmt: skip
    if "plain_server" in largest:
        plain = largest["plain_server"]
        verdict.append(f"Served with `--plain` (MLflow's routes alone, as a lab's own MLflow server), the same "
                       f"store took {plain['report']['wall_s']:.0f} s and {plain['compare']['wall_s']:.0f} s: "
                       f"MLflow's search sends every run whole, at about "
                       f"{1000 * plain['report']['server_cpu_s'] / int(max(sizes, key=int)):.0f} ms of the "
                       "server's CPU a run.")  # fmt: skip
    parts.insert(3, " ".join(verdict))
    provenance = [("`store_load.json`", data.get("measured"))]
    if (Path(bench_dir) / "lab_sweep.json").is_file():
        from benchmarks.lab_sweep import sweep_part

        sweep = load(bench_dir, "lab_sweep.json")
        parts += [sweep_part(sweep), commands(f"-m benchmarks.lab_sweep --seeds {sweep['seeds']}"),
                  "Output: `benchmarks/lab_sweep.json`."]  # fmt: skip
        provenance.append(("`lab_sweep.json`", sweep.get("measured")))
    parts.append(provenance_table(provenance))
    return "\n\n".join(parts)


COMMANDS = ("report", "compare", "sync_all")
PLAIN = ("report", "compare")  # what --also-plain times again against the server started with --plain


def copied(figures: dict[str, Any]) -> str:
    """What stands for the fill figures of a store whose runs were copied inside PostgreSQL from a smaller
    one filled by this script (the note says how): a real fill of 10,000 runs takes hours on a loaded machine."""
    source = figures["fill"].get("copied_from")
    return f"copied from {source:,}" if source else ""


def seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 1 else f"{value:.2f} s"


SECTION = Section(
    "A lab's store and sweep",
    order=35,
    reads=("store_load.json", "lab_sweep.json"),
    render=store_section,
    sources=("mlrb/store", "mlrb/sync.py", "mlrb/report", "mlrb/compare.py", "requirements.lock"),
)


if __name__ == "__main__":
    main()
