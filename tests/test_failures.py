"""Every failure attributed and survived, the quick checks (no task assets needed):
bad budgets, paths and tracking stores refused in one line before anything runs,
a store created whole even by processes starting together or a disk that fills up,
a submission that cannot be loaded blamed on the agent, model servers that answer
garbage or nothing named in the error, and signals turned into an orderly stop.
Whole runs that fail are in test_failures_runs.py."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import compose_config, mlflow_client, run_cli, tiny_llm_merging
from mlrb.core import interrupts
from mlrb.core.budget import Budget
from mlrb.core.config import BudgetConfig, ConfigError, TrackingConfig
from mlrb.core.status import Status, of_run
from mlrb.store import empty_tables, tracking
from mlrb.tasks.llm_merging.task import LlmMerging


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("mlrb: error: ")
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the status vocabulary -------------------------------------------------------------


@pytest.mark.fast
def test_each_status_counts_or_not_and_is_recorded_with_the_mlflow_status_a_resume_needs():
    assert [s.value for s in Status] == [
        "ok", "invalid", "no_submission", "budget_exhausted", "agent_error", "infra_error", "killed",
    ]  # fmt: skip
    # Not the agent's doing: not FINISHED, so a re-launched sweep (it skips FINISHED runs) runs them again.
    assert {s: s.mlflow_status for s in Status if not s.is_attempt} == {
        Status.INFRA_ERROR: "FAILED", Status.KILLED: "KILLED",
    }  # fmt: skip
    assert all(s.mlflow_status == "FINISHED" for s in Status if s.is_attempt)
    # How the agent stopped says most; when it submitted, what it submitted decides.
    assert of_run(Status.OK, collected=True, valid=True) == Status.OK
    assert of_run(Status.OK, collected=True, valid=False) == Status.INVALID
    assert of_run(Status.OK, collected=False, valid=False) == Status.NO_SUBMISSION
    assert of_run(Status.AGENT_ERROR, collected=True, valid=True) == Status.AGENT_ERROR
    assert of_run(Status.BUDGET_EXHAUSTED, collected=False, valid=False) == Status.BUDGET_EXHAUSTED


# ---- 4. budgets and limits: finite and positive, or refused at compose time ----------------


@pytest.mark.fast
@pytest.mark.parametrize(
    "override, expected",
    [
        ("budget.max_usd=nan", "budget.max_usd must be positive, got nan"),
        ("budget.wall_time_s=inf", "budget.wall_time_s must be positive, got inf"),
        ("budget.max_steps=0", "budget.max_steps must be positive, got 0"),
        ("sandbox.command_timeout_s=nan", "sandbox.command_timeout_s must be positive, got nan"),
        ("task.submission=../../..", "task.submission must be a path inside the workspace"),
        ("task.submission=/etc", "task.submission must be a path inside the workspace"),
        ("task.submission=", "task.submission must be a path inside the workspace"),
        ("paths.cache_dir=", "paths.cache_dir is empty"),
        ("tracking.dir=", "tracking.dir is empty"),
    ],
)
def test_bad_budgets_limits_and_paths_are_one_line_and_exit_2(tmp_path, override, expected):
    args = [override, f"hydra.run.dir={tmp_path / 'run'}"]
    if not override.startswith("tracking.dir"):
        args.append(f"tracking.dir={tmp_path / 'mlruns'}")
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert expected in one_error_line(result)
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlruns").exists()  # nothing half-written


@pytest.mark.fast
def test_a_nan_wall_time_in_a_sweep_is_refused_before_any_run_exists(tmp_path):
    result = run_cli("-m", "budget.wall_time_s=600,nan", f"tracking.dir={tmp_path / 'mlruns'}",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert "budget.wall_time_s must be positive, got nan" in one_error_line(result)
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "sweep").exists()


@pytest.mark.fast
def test_a_nan_cost_stops_the_budget_instead_of_lifting_it():
    budget = Budget(BudgetConfig(name="b", wall_time_s=60, max_steps=10, max_usd=1.0))
    budget.record_usage(10, 10, 0.5)
    assert budget.exhausted() is None
    budget.record_usage(10, 10, float("nan"))  # a price or usage some server got wrong
    assert budget.exhausted() == "usd"


@pytest.mark.fast
def test_the_typed_config_refuses_a_nan_budget_too():
    with pytest.raises(ConfigError, match="budget.max_usd must be positive, got nan"):
        compose_config("budget.max_usd=nan")


# ---- 5, 7, 8. the tracking store: checked first, created whole, secrets masked --------------


@contextmanager
def read_only(path: Path):
    """A file or folder nobody may write, root included (the tests may run as root)."""
    mode = path.stat().st_mode
    path.chmod(0o555 if path.is_dir() else 0o444)
    immutable = os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(path)]).returncode == 0
    try:
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(mode)


@pytest.mark.fast
def test_a_store_that_cannot_be_written_is_one_line_naming_it_and_leaves_no_run_folder(tmp_path):
    store = tmp_path / "mlruns"
    tracking.check_store(TrackingConfig(dir=str(store)))  # a new, good store
    with read_only(store / "mlflow.db"):
        started = time.monotonic()
        result = run_cli(f"tracking.dir={store}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
        took = time.monotonic() - started
    line = one_error_line(result)
    assert result.returncode == 2 and took < 60
    assert f"tracking store 'sqlite:///{store / 'mlflow.db'}' (tracking.dir): cannot write to it" in line
    assert not (tmp_path / "run").exists()  # Hydra's folder for a run that never started is gone
    assert mlflow_client(tmp_path).search_experiments(filter_string="name = 'llm_merging'") == []


@pytest.mark.fast
@pytest.mark.parametrize(
    "uri, expected",
    [
        ("http://alice:s3cret@127.0.0.1:{port}", "tracking store 'http://alice:***@127.0.0.1:{port}' (tracking.uri): "
                                                 "cannot reach it"),
        ("htp://alice:s3cret@127.0.0.1:{port}", "tracking store 'htp://alice:***@127.0.0.1:{port}' (tracking.uri): "
                                                "not a tracking URI mlrb can use"),
    ],
)  # fmt: skip
def test_a_dead_or_wrong_tracking_uri_is_one_line_within_seconds_password_masked(tmp_path, uri, expected):
    port = free_port()  # nothing listens there
    started = time.monotonic()
    result = run_cli(f"tracking.uri={uri.format(port=port)}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    took = time.monotonic() - started
    line = one_error_line(result)
    assert result.returncode == 2 and expected.format(port=port) in line
    assert "s3cret" not in result.stdout + result.stderr
    assert took < 30, f"{took:.0f} s"  # MLflow's own retries took minutes
    assert not (tmp_path / "run").exists()


@pytest.mark.fast
def test_a_server_that_answers_garbage_is_not_taken_for_a_store(tmp_path):
    with garbage_server() as url:
        with pytest.raises(ConfigError, match=r"tracking store 'http://127\.0\.0\.1:\d+' \(tracking.uri\): "):
            tracking.check_store(TrackingConfig(uri=url))


@pytest.mark.integration
def test_processes_creating_a_new_store_at_once_all_get_it(tmp_path):
    store = tmp_path / "mlruns"
    errors = in_processes_of_their_own(create_store, [(str(store), None)] * 4)
    assert errors == [None, None, None, None], errors
    client = mlflow_client(tmp_path)
    client.create_experiment("after")  # the store is whole: it takes writes
    assert {e.name for e in client.search_experiments()} == {"Default", "after"}
    assert sorted(p.name for p in store.iterdir() if p.name.startswith("mlflow.db.")) == ["mlflow.db.lock"]


def in_processes_of_their_own(function, calls: list) -> list:
    """FUNCTION over CALLS, each in a process of its own started at once, as separate commands
    are: forked from a server that imported the store's code once (none pays for it again) and
    holds no connection to any store."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["mlrb.store.tracking", "mlflow.store.tracking.sqlalchemy_store"])
    with context.Pool(len(calls)) as pool:
        return pool.map(function, calls, chunksize=1)


def create_store(args: tuple[str, int | None] | tuple[str, int | None, str]) -> str | None:
    """`tracking.check_store` on the store in folder STORE, with files limited to LIMIT bytes
    (None: no limit) as on a full disk, and the cache in CACHE where given; the error it raised, as
    a traceback's last line says it."""
    store, limit, *cache = args
    if cache:
        os.environ["MLRB_CACHE_DIR"] = cache[0]
        empty_tables.kept_path.cache_clear()
    if limit is not None:
        limited_file_size(limit)()
    try:
        tracking.check_store(TrackingConfig(dir=store))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def limited_file_size(limit_bytes: int):
    """For a child process: files cannot grow past limit_bytes, as on a full disk."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write (EFBIG) instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return apply


@pytest.mark.fast
@pytest.mark.parametrize("kept", [False, True], ids=["made-by-mlflow", "copied"])
def test_a_store_creation_cut_short_by_a_full_disk_leaves_no_broken_store(tmp_path, kept):
    """Made by MLflow's migrations, or copied from the empty store kept in the cache (a first store
    made it there): either way the disk fills up before the store is whole."""
    store, cache = tmp_path / "mlruns", str(tmp_path / "cache")
    if kept:
        assert in_processes_of_their_own(create_store, [(str(tmp_path / "first"), None, cache)]) == [None]
    (error,) = in_processes_of_their_own(create_store, [(str(store), 64_000, cache)])
    assert error is not None
    cause = (f"File too large ({store / 'mlflow.db.creating'})" if kept
             else "OperationalError: (sqlite3.OperationalError) disk I/O error")  # fmt: skip
    assert error.startswith(f"ConfigError: tracking store 'sqlite:///{store / 'mlflow.db'}' (tracking.dir): cannot "
                            f"create it: {cause}"), error  # fmt: skip
    assert not (store / "mlflow.db").exists()  # only the temporary file, never a half-made store
    assert in_processes_of_their_own(create_store, [(str(store), None, cache)]) == [None]  # room again: created whole
    assert [e.name for e in mlflow_client(tmp_path).search_experiments()] == ["Default"]
    assert not (store / "mlflow.db.creating").exists()


@pytest.mark.fast
def test_a_store_that_mlflow_left_half_created_is_made_afresh_with_one_warning(tmp_path, caplog):
    # MLflow itself creating the store (as older mlrb did) when the disk fills up: a broken file remains.
    db = tmp_path / "half.db"
    code = "import sys; from mlflow.tracking import MlflowClient; MlflowClient(sys.argv[1]).search_experiments()"
    full = subprocess.run([sys.executable, "-c", code, f"sqlite:///{db}"], preexec_fn=limited_file_size(240_000),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert full.returncode != 0 and db.exists()  # MLflow cannot open it again: "table ... already exists"
    tracking.check_store(TrackingConfig(uri=f"sqlite:///{db}"))
    assert any("was damaged and held no runs" in r.getMessage() for r in caplog.records)
    from mlflow.tracking import MlflowClient

    assert [e.name for e in MlflowClient(f"sqlite:///{db}").search_experiments()] == ["Default"]
    assert len(list(tmp_path.glob("half.db.broken-*"))) == 1  # kept aside, not deleted


@pytest.mark.fast
def test_uri_secrets_are_masked_wherever_the_config_is_written():
    cfg = TrackingConfig(uri="https://alice:s3cret@mlflow.example.org:5000/x?token=abc123&q=1")
    assert tracking.mask_uri(cfg.uri) == "https://alice:***@mlflow.example.org:5000/x?token=***&q=1"
    assert tracking.secrets_in(cfg) == ["s3cret", "abc123"]
    assert "s3cret" not in json.dumps(tracking.masked(cfg))


# ---- 1. a submission that cannot be loaded is the agent's fault ---------------------------


def model_folder(path: Path) -> Path:
    """A tiny Llama model folder, saved as transformers saves one."""
    from mlrb.task_kit.tiny_models import make_llama, train_tokenizer

    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog"] * 20, vocab_size=60)
    model = make_llama(tokenizer, {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2})
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.fast
def test_llm_merging_refuses_a_config_that_is_not_an_object_with_the_shared_rule(tmp_path):
    folder = model_folder(tmp_path / "model")
    (folder / "config.json").write_text("[1]")
    task = tiny_llm_merging()
    problem, _ = LlmMerging(task.spec, task.higher_is_better, folder).check_submission(folder)
    assert problem == "config.json must hold a JSON object, not a list"


@pytest.mark.fast
def test_weights_that_do_not_fit_the_config_are_the_submissions_problem(tmp_path):
    from mlrb.scoring.worker import submission_problem

    folder = model_folder(tmp_path / "model")
    assert submission_problem(folder) == ""
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    assert submission_problem(folder).startswith("the model cannot be loaded or run with transformers: ")


# ---- 2, 8. model servers that answer garbage or not at all --------------------------------


@contextmanager
def garbage_server(body: bytes = b"<html><body>502 Bad Gateway (proxy)</body></html>", content_type="text/html"):
    """A real HTTP server on loopback that answers every request with 200 and BODY."""

    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(200)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def chat_request() -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@pytest.mark.fast
@pytest.mark.parametrize("body, content_type", [(b"<html>oops</html>", "text/html"), (b"{not json", "application/json"),
                                                (b'{"id": "x"}', "application/json")])  # fmt: skip
def test_a_200_that_is_not_an_api_reply_is_a_retried_api_error_naming_the_server(body, content_type):
    from mlrb.models.providers import AnthropicProvider, ApiError, OpenAIProvider

    with garbage_server(body, content_type) as url:
        for provider in (OpenAIProvider("k", f"{url}/v1", None, "max_tokens", 0), AnthropicProvider("k", url, None)):
            request = provider.request("m", "system", [], [], 5) if provider.name == "anthropic" else chat_request()
            with pytest.raises(ApiError) as caught:
                provider.call(request, timeout_s=10)
            assert caught.value.transient  # retried, then the agent fails and the workspace is scored
            assert f"API at {url}" in str(caught.value) and "not an API reply" in str(caught.value)


@pytest.mark.fast
def test_a_connection_error_names_the_endpoint():
    from mlrb.models.providers import ApiError, OpenAIProvider

    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ApiError, match=f"openai API unreachable at {url}: APIConnectionError"):
        OpenAIProvider("k", url, None, "max_tokens", 0).call(chat_request(), timeout_s=5)


# ---- 3, 8. signals -----------------------------------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_runs_the_cleanup_and_raises_an_interruption_then_handlers_are_restored(signum):
    # As in a terminal: the default disposition (under `nohup` SIGHUP is ignored, and stays so)
    default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
    outer = signal.signal(signum, default)
    try:
        cleaned = []
        with pytest.raises(interrupts.Interrupted) as caught:
            with interrupts.guarded() as guard:
                guard.on_interrupt(lambda: cleaned.append(True))
                os.kill(os.getpid(), signum)
                time.sleep(5)  # the handler interrupts this
        assert cleaned == [True] and caught.value.exit_code == 128 + signum
        assert signal.getsignal(signum) == default
    finally:
        signal.signal(signum, outer)


@pytest.mark.fast
def test_an_ignored_sighup_stays_ignored_as_nohup_asks():
    outer = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with interrupts.guarded():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: nothing happens
            time.sleep(0.1)
    finally:
        signal.signal(signal.SIGHUP, outer)


@pytest.mark.fast
def test_a_signal_while_the_outcome_is_recorded_waits_for_it():
    recorded = []
    with interrupts.guarded() as guard:
        with guard.hold():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            recorded.append("whole")
        assert recorded == ["whole"]
        with pytest.raises(interrupts.Interrupted, match="SIGTERM"):
            guard.release()  # then the run stops


@pytest.mark.fast
def test_a_launchers_own_handler_keeps_its_signal_and_the_run_knows_it_came():
    told = []

    def launcher_handler(signum, frame):
        told.append(signum)

    previous = signal.signal(signal.SIGTERM, launcher_handler)  # as submitit does in its jobs
    try:
        with interrupts.guarded() as guard:
            assert not guard.launcher_signalled(within_s=0.3)
            os.kill(os.getpid(), signal.SIGTERM)  # no Interrupted: the launcher decides
            assert guard.launcher_signalled(within_s=5) and told == [signal.SIGTERM]
            assert guard.received == []
        assert signal.getsignal(signal.SIGTERM) is launcher_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.fast
def test_a_requeue_whose_scontrol_dies_of_the_job_s_sigterm_exits_as_the_launcher_would():
    # submitit's SIGUSR2 handler runs `scontrol requeue`; SLURM answers with a SIGTERM to every
    # process of the job, that scontrol too, which can die of it before it exits.
    def requeue(signum, frame):
        subprocess.check_call(["sh", "-c", "kill -TERM $$"])
        sys.exit(-1)

    def requeue_refused(signum, frame):
        subprocess.check_call(["sh", "-c", "exit 1"])

    previous = signal.getsignal(signal.SIGUSR2)
    try:
        for handler, raised in ((requeue, SystemExit), (requeue_refused, subprocess.CalledProcessError)):
            signal.signal(signal.SIGUSR2, handler)
            with interrupts.guarded() as guard:
                with pytest.raises(raised):
                    os.kill(os.getpid(), signal.SIGUSR2)
                    time.sleep(5)
                assert guard.launcher_signalled() and guard.received == []
            assert signal.getsignal(signal.SIGUSR2) is handler
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        with interrupts.guarded():  # with no launcher, SIGUSR2 is left alone
            assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR2, previous)
