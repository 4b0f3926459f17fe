"""Put runs into a tracking store from their run folders' records (mlrb/store/record.py):

    python -m mlrb.sync RUN_DIR [RUN_DIR ...] [--tracking-dir DIR | --tracking-uri URI]
    python -m mlrb.sync --all [--outputs outputs] [--tracking-dir DIR | --tracking-uri URI]

Each run folder goes to the store it was recorded for (its record names it), or to the one
named. For each, what the store lacks of the record is uploaded: params, tags, metric
values (by step), artifacts, the agent's traces (by step, with their own times) and the end
status. A run the store already holds (the one tagged `mlrb.run_id` with the record's run
id) is completed; otherwise a run is created with the record's name in its experiment, so
tagged. Syncing again uploads nothing twice, and a sync stopped half-way is
finished by the next. Once a run is whole in the store, its run carries the tag
`mlrb.synced_record` (a digest of its record and of the files of the folders it logs): a later
sync finds the run in sync by that tag alone, and a sync of many folders reads the store's
runs in one paged search rather than asking about each. Use it to upload a run whose store was away while it ran, to rebuild a
lost or corrupt store from the run folders, or to copy runs into another store (say a
team's server).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from mlrb.core.config import ConfigError, TrackingConfig
from mlrb.core.tags import Tag
from mlrb.store import record


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mlrb.sync", description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="*", type=Path, help="run folders (outputs/runs/<run>), each with record.jsonl")
    p.add_argument("--all", action="store_true", help="every run folder under --outputs")
    p.add_argument("--outputs", type=Path, default=Path("outputs"), help="where --all looks (default: outputs)")
    p.add_argument("--tracking-uri", default=None, help="this store instead of the one each run was recorded for")
    p.add_argument("--tracking-dir", default=None, help="the SQLite store in this folder instead")
    return p


def recorded_store(run_dir: Path) -> TrackingConfig:
    """The store RUN_DIR's run was recorded for (its record's last `opened` line); a record that
    does not name one goes to $MLFLOW_TRACKING_URI, else to the SQLite store in mlruns."""
    opened = [line for line in record.read(run_dir) if line["kind"] == "opened"]
    store = opened[-1].get("store") if opened else None
    if not store:
        return TrackingConfig()
    if "***" in (store.get("uri") or ""):
        raise ConfigError(
            f"{run_dir}: its store {store['uri']} needs a password, which the record does not keep: "
            "name the store with --tracking-uri"
        )
    return TrackingConfig(uri=store.get("uri"), dir=store.get("dir") or "mlruns")


def stores_of(args: argparse.Namespace, folders: list[Path]) -> dict[tuple[str | None, str], list[Path]]:
    """The run folders by the store each goes to, as (uri, dir)."""
    if args.tracking_uri or args.tracking_dir:
        return {(args.tracking_uri, args.tracking_dir or "mlruns"): folders}
    grouped: dict[tuple[str | None, str], list[Path]] = {}
    for folder in folders:
        cfg = recorded_store(folder)
        grouped.setdefault((cfg.uri, cfg.dir), []).append(folder)
    return grouped


def run_dirs(args: argparse.Namespace) -> list[Path]:
    folders = list(args.run_dirs)
    if args.all:
        folders += sorted(p.parent for p in (args.outputs / "runs").glob(f"*/{record.FILE}"))
    if not folders:
        raise ConfigError(f"no run folders: name some, or --all for those under {args.outputs}/runs")
    missing = [str(f) for f in folders if not (f / record.FILE).is_file()]
    if missing:
        raise ConfigError(f"no {record.FILE} in {', '.join(missing)}: not a run folder of this mlrb")
    return folders


# A sync of at least this many run folders reads the store's runs in one paged search (StoreRuns)
# instead of looking each run up on its own (two requests).
INDEX_FROM = 50


def sync_run(client: Any, artifact_root: str | None, run_dir: Path, store_runs: Any = None) -> str:
    """Upload what the store lacks of RUN_DIR's record; returns one line saying what was done.
    STORE_RUNS (tracking.StoreRuns), when given, is where the store's run is looked up."""
    from mlrb.store import tracking

    lines = record.read(run_dir)
    opened = [line for line in lines if line["kind"] == "opened"]
    if not opened:
        raise ConfigError(f"{run_dir / record.FILE}: the run was never opened in a store")
    state = record.fold(lines)
    run = store_runs.find(state["run_id"]) if store_runs is not None else tracking.find_run(client, state["run_id"])
    digest = record_digest(run_dir, state)
    if run is not None and run.data.tags.get(Tag.SYNCED_RECORD) == digest:
        return f"{run_dir}: in sync, nothing to upload (run {run.info.run_id})"  # whole when the tag was set
    created = run is None
    if run is None:  # its record's tags name its own id (Tag.RUN_ID): a later sync finds it by that
        experiment = tracking.experiment_id(client, opened[-1]["experiment"], artifact_root)
        opening = {**state["tags"], Tag.RUN_ID: state["run_id"]}
        run = tracking.with_retries(
            lambda: client.create_run(experiment, run_name=opened[-1]["run_name"], tags=opening)
        )
    missing = missing_lines(client, run, lines, state, run_dir, created)
    # Written as a live run writes its record: the same exporter, line by line.
    writer = tracking.MlflowRunWriter(client, run.info.run_id, run.info.experiment_id)
    record.export(writer, missing, run_dir)
    writer.set_tags({Tag.SYNCED_RECORD: digest})  # last: set only once all of the record is in the store
    count = Counter[str]()
    for line in missing:  # params, tags and metric values by name; the rest one per line
        kind = line["kind"]
        count[kind] += len(line[kind]) if kind in ("params", "tags", "metrics") else 1
    what = [
        f"{count['params']} params",
        f"{count['tags']} tags",
        f"{count['metrics']} metric values",
        f"{count['artifact']} artifacts",
        f"{count['trace']} traces",
    ]
    if count["status"]:
        what.append(f"status {state['status']}")
    done = ", ".join(what) if missing else "in sync, nothing to upload"
    return f"{run_dir}: {done} ({'new run' if created else 'run'} {run.info.run_id})"


def record_digest(run_dir: Path, state: dict[str, Any]) -> str:
    """What the store's run is tagged with once it holds all of RUN_DIR's record: a digest of the
    record's whole lines and of the names of the files in the folders it logs (a file added to
    one since is uploaded by the next sync, as the record's own lines are)."""
    data = (run_dir / record.FILE).read_bytes()
    digest = hashlib.sha256(data[: data.rfind(b"\n") + 1])
    for file, _, is_dir in state["artifacts"]:
        path = Path(file) if Path(file).is_absolute() else run_dir / file
        if is_dir and path.is_dir():
            for found in sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()):
                digest.update(f"\0{file}/{found}".encode("utf-8", "backslashreplace"))
    return digest.hexdigest()[:32]


def missing_lines(
    client: Any, run: Any, lines: list[dict], state: dict[str, Any], run_dir: Path, created: bool = False
) -> list[dict]:
    """The record's lines (`state`: them folded), cut down to what the store's run lacks of
    them: params it does not hold, tags it holds otherwise, metric values (by step) it lacks,
    each with the time of the line that logged it, artifact files it lacks (a folder's, file
    by file), the traces of the steps it lacks, and the end status when it differs. A run just
    `created` lacks all of them: the store is not asked."""
    from mlrb.store import tracking

    run_id = run.info.run_id
    wanted = {k: v[: tracking.PARAM_CHARS] for k, v in state["params"].items()}  # as the store keeps them
    conflicts = sorted(k for k, v in wanted.items() if k in run.data.params and run.data.params[k] != v)
    if conflicts:
        raise ConfigError(f"{run_dir}: the store's run {run_id} has other values for params {conflicts}")
    missing: list[dict] = []
    params = {k: v for k, v in wanted.items() if k not in run.data.params}
    if params:
        missing.append({"kind": "params", "params": params})
    tags = {k: v for k, v in state["tags"].items() if run.data.tags.get(k) != v}
    if tags:
        missing.append({"kind": "tags", "tags": tags})

    stored = {key: stored_values(client, run, key, history, created) for key, history in state["metrics"].items()}
    for line in lines:
        if line["kind"] != "metrics":
            continue
        values = {}
        for key, value in line["metrics"].items():
            if stored[key][(line["step"], value)] > 0:
                stored[key][(line["step"], value)] -= 1
            else:
                values[key] = value
        if values:
            missing.append({**line, "metrics": values})

    stored_files = set() if created else artifact_files(client, run_id)
    for file, folder, is_dir in state["artifacts"]:
        path = Path(file) if Path(file).is_absolute() else run_dir / file
        for source in sorted(p for p in path.rglob("*") if p.is_file()) if is_dir else [path]:
            inside = source.relative_to(path).parent if is_dir else Path()
            if str(Path(folder or "") / inside / source.name) not in stored_files and source.is_file():
                destination = str(Path(folder or "") / inside)
                missing.append(
                    {
                        "kind": "artifact",
                        "file": str(source.absolute()),
                        "is_dir": False,
                        "artifact_path": None if destination == "." else destination,
                    }
                )

    traces = state["traces"] if created else missing_traces(client, run, state["traces"])
    missing += [{"kind": "trace", "trace": trace} for trace in traces]
    if state["status"] is not None and run.info.status != state["status"]:
        missing.append({"kind": "status", "status": state["status"]})
    return missing


def stored_values(client: Any, run: Any, key: str, history: list[list], created: bool) -> Counter:
    """The (step, value) pairs the store's run holds of metric KEY, as a count of each. A metric the
    record logged once, whose latest value in the store is that value, is taken as held without
    asking for its history (a request per metric: most of a run's metrics are logged once)."""
    if created or key not in run.data.metrics:
        return Counter()
    if len(history) == 1 and run.data.metrics[key] == history[0][1]:
        return Counter([(history[0][0], history[0][1])])
    return Counter((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


def missing_traces(client: Any, run: Any, traces: list[dict]) -> list[dict]:
    """The record's step traces that the store lacks (a step's trace is one of the run's
    traces tagged with its step)."""
    from mlrb.core.tags import Tag
    from mlrb.store import tracking

    if not traces:
        return []
    experiment_id, run_id = run.info.experiment_id, run.info.run_id
    stored = tracking.with_retries(lambda: client.search_traces(locations=[experiment_id], run_id=run_id))
    steps = Counter(trace.info.tags.get(Tag.STEP) for trace in stored)
    lacking = []
    for trace in traces:
        if steps[str(trace["step"])] > 0:
            steps[str(trace["step"])] -= 1
        else:
            lacking.append(trace)
    return lacking


def artifact_files(client: Any, run_id: str, folder: str | None = None) -> set[str]:
    files: set[str] = set()
    for entry in client.list_artifacts(run_id, folder):
        files |= artifact_files(client, run_id, entry.path) if entry.is_dir else {entry.path}
    return files


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        from mlrb.store import tracking

        for (uri, folder_of_store), folders in stores_of(args, run_dirs(args)).items():
            cfg = TrackingConfig(uri=uri, dir=folder_of_store)
            tracking.check_store(cfg)
            client, artifact_root = tracking.client_for(cfg)
            store_runs = tracking.StoreRuns(client) if len(folders) >= INDEX_FROM else None
            for folder in folders:
                print(sync_run(client, artifact_root, folder, store_runs), flush=True)
    except (ConfigError, ValueError) as e:
        print(f"mlrb.sync: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
