"""What the metering proxy (mlrb/models/proxy.py) adds to a model call, against calling the same
scripted upstream directly, in the same process and run (targets: at most 2 ms at the median
per call, and a stream's first byte at most 5 ms after the upstream's); and what the run's end
adds while it waits for calls still open.

    .venv/bin/python -m benchmarks.proxy [--calls 300] [--out benchmarks/proxy.json]

The upstream is tests/fake_llm_server.py (a loopback HTTP server). Each call is a plain
HTTP/1.1 POST over a kept-alive connection, so what is measured is the proxy and not an
SDK: a whole Messages reply (latency to its last byte), and a streamed one whose upstream
pauses after its first event (latency to the first byte, which must not wait for the pause).
Calls alternate between direct and proxied, so both see the same machine load. The proxy serves
the paper's model only, priced from the genai-prices table, and holds each call's estimate
from a dollar budget while it is in flight, as in a run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks import results as results_page
from benchmarks.results import Section, commands, load, spread, table, where
from mlrb.core.budget import Budget
from mlrb.core.config import BudgetConfig
from mlrb.models.prices import price_of
from mlrb.models.proxy import MeteringProxy, Upstream
from tests.fake_llm_server import FakeLlmServer, reply  # the scripted upstream

TARGET_MS = 2.0  # added at the median per call
FIRST_BYTE_TARGET_MS = 5.0  # a stream's first byte after the upstream's
PAUSE_S = 0.05  # a streamed upstream's pause after its first event
TOKEN, KEY = "bench-token", "sk-ant-bench"
MODEL = "claude-sonnet-5"  # agent=claude's default, priced from the table
OPEN_END_S = 0.5  # a call still open at the run's end: its upstream's end comes this long after


def timed_call(connection: http.client.HTTPConnection, path: str, stream: bool) -> tuple[float, float]:
    """(seconds to the first byte of the body, seconds to its end) of one POST."""
    body = json.dumps({"model": MODEL, "max_tokens": 10, "stream": stream,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip
    headers = {"content-type": "application/json", "x-api-key": TOKEN, "anthropic-version": "2023-06-01"}
    started = time.perf_counter()
    connection.request("POST", path, body=body, headers=headers)
    response = connection.getresponse()
    first = response.read1(1 << 16)
    first_at = time.perf_counter() - started
    rest = response.read()
    ended = time.perf_counter() - started
    if response.status != 200 or not (first + rest):
        raise RuntimeError(f"{path}: status {response.status}: {(first + rest)[:200]!r}")
    return first_at, ended


def settling(rounds: int) -> tuple[list[float], list[float]]:
    """What the run's end (`MeteringProxy.settle_open`) takes, in ms: with no call open, and with one
    stream the agent hung up on whose end comes OPEN_END_S later, beyond that wait."""
    idle, added = [], []
    for _ in range(rounds):
        script = [reply(text="ok", usage=(10, 5), end_after_s=OPEN_END_S)]
        with FakeLlmServer(script) as server:
            upstream = Upstream(
                server.anthropic_url, KEY, models={MODEL: price_of("anthropic", MODEL, None, None, "bench")}
            )
            budget = Budget(BudgetConfig(name="bench", wall_time_s=3600, max_steps=1, max_usd=1000.0))
            with MeteringProxy({"anthropic": upstream}, TOKEN, budget) as proxy:  # (its end: no call after it)
                started = time.perf_counter()
                proxy.settle_open(wait_s=120)
                idle.append((time.perf_counter() - started) * 1000)
            with MeteringProxy({"anthropic": upstream}, TOKEN, budget) as proxy:
                connection = http.client.HTTPConnection(urlsplit(proxy.url).netloc, timeout=30)
                body = json.dumps({"model": MODEL, "max_tokens": 10, "stream": True,
                                   "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
                connection.request("POST", "/anthropic/v1/messages", body=body,
                                   headers={"content-type": "application/json", "x-api-key": TOKEN})  # fmt: skip
                connection.getresponse().read1(1 << 16)  # its first events: the end comes OPEN_END_S later
                hung_up = time.perf_counter()
                connection.close()
                proxy.settle_open(wait_s=120)
                added.append((time.perf_counter() - hung_up - OPEN_END_S) * 1000)
    return idle, added


def stat(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="whole replies per side (streams: a tenth)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here (JSON)")
    args = parser.parse_args()
    measured = results_page.provenance(sources=SECTION.sources)
    streams = max(5, args.calls // 10)
    script = [reply(text="ok", usage=(10, 5))] * (2 * args.calls + 10)
    script += [reply(text="ok", usage=(10, 5), gap_s=PAUSE_S)] * (2 * streams + 10)
    with FakeLlmServer(script) as server:
        upstream = Upstream(
            server.anthropic_url, KEY, models={MODEL: price_of("anthropic", MODEL, None, None, "bench")}
        )
        budget = Budget(BudgetConfig(name="bench", wall_time_s=3600, max_steps=1, max_usd=1000.0))
        with MeteringProxy({"anthropic": upstream}, TOKEN, budget) as proxy:
            direct = http.client.HTTPConnection(urlsplit(server.anthropic_url).netloc, timeout=30)
            proxied = http.client.HTTPConnection(urlsplit(proxy.url).netloc, timeout=30)
            for connection, path in ((direct, "/v1/messages"), (proxied, "/anthropic/v1/messages")):
                for _ in range(5):  # warm: connections open, code paths run once
                    timed_call(connection, path, stream=False)
            added, first_bytes = [], []
            for _ in range(args.calls):
                alone = timed_call(direct, "/v1/messages", stream=False)[1]
                through = timed_call(proxied, "/anthropic/v1/messages", stream=False)[1]
                added.append((through - alone) * 1000)
            for _ in range(streams):
                alone = timed_call(direct, "/v1/messages", stream=True)[0]
                through = timed_call(proxied, "/anthropic/v1/messages", stream=True)[0]
                first_bytes.append((through - alone) * 1000)
    idle, open_added = settling(max(1, args.calls // 30))
    figures = {
        "calls": args.calls,
        "streams": streams,
        "added_ms": stat(added),
        "first_byte_added_ms": stat(first_bytes),
        "upstream_pause_s": PAUSE_S,
        "run_end_none_open_ms": stat(idle),
        "run_end_one_open_added_ms": stat(open_added),
        "open_call_end_after_s": OPEN_END_S,
        "targets_ms": {"added": TARGET_MS, "first_byte_added": FIRST_BYTE_TARGET_MS},
        "measured": measured,
    }
    print(
        f"added per whole call:   {figures['added_ms']['median']:.2f} ms at the median "
        f"[{figures['added_ms']['min']:.2f}-{figures['added_ms']['max']:.2f}] (target <= {TARGET_MS} ms)"
    )
    print(f"added to a stream's first byte: {figures['first_byte_added_ms']['median']:.2f} ms at the median "
          f"[{figures['first_byte_added_ms']['min']:.2f}-{figures['first_byte_added_ms']['max']:.2f}] "
          f"(target <= {FIRST_BYTE_TARGET_MS} ms; the upstream pauses {PAUSE_S * 1000:.0f} ms after it)")  # fmt: skip
    print(f"the run's end with no call open: {figures['run_end_none_open_ms']['median']:.3f} ms at the median; "
          f"with one open, beyond the upstream's own {OPEN_END_S:g} s to finish it: "
          f"{figures['run_end_one_open_added_ms']['median']:.1f} ms at the median")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"written to {results_page.update(args.out)}", file=sys.stderr)


# -- its section of the results page (benchmarks/results.py) -----------------------------------


def proxy_section(bench_dir: Path) -> str:
    data = load(bench_dir, "proxy.json")
    targets = data["targets_ms"]
    rows = [
        ["a whole reply (to its last byte)", spread(data["added_ms"], " ms"), f"<= {targets['added']:g} ms",
         str(data["calls"])],
        [f"a stream's first byte (the upstream pauses {data['upstream_pause_s'] * 1000:.0f} ms after it)",
         spread(data["first_byte_added_ms"], " ms"), f"<= {targets['first_byte_added']:g} ms", str(data["streams"])],
    ]  # fmt: skip
    if "run_end_none_open_ms" in data:  # the run's end: its calls settled (MeteringProxy.settle_open)
        rounds = str(max(1, data["calls"] // 30))
        rows += [
            ["the run's end, no call open", spread(data["run_end_none_open_ms"], " ms", 3), "-", rounds],
            [f"the run's end, one call open (beyond the upstream's {data['open_call_end_after_s']:g} s to end it)",
             spread(data["run_end_one_open_added_ms"], " ms"), "-", rounds],
        ]  # fmt: skip
    return "\n\n".join([
        "What a model call pays for going through the run's metering proxy (`mlrb/models/proxy.py`): the same "
        "scripted upstream (tests/fake_llm_server.py) called directly and through the proxy, alternately, over "
        "kept-alive HTTP/1.1 connections, so the figures are the proxy's and not an SDK's. Then what the run's "
        "end adds while it waits for the agent's calls to settle (`MeteringProxy.settle_open`): with none open, "
        "and with one stream the agent hung up on, beyond the upstream's own time to end it.",
        "Measured with:",
        commands("-m benchmarks.proxy --out benchmarks/proxy.json"),
        f"Output: `benchmarks/proxy.json`. {where(data.get('measured'))}",
        table(["added to", "median [min-max]", "target", "calls"], rows),
    ])  # fmt: skip


SECTION = Section(
    "The metering proxy's cost", order=60, reads=("proxy.json",), render=proxy_section, page="suite",
    sources=("mlrb/models/proxy.py", "mlrb/models/api_shapes.py", "mlrb/core/budget.py", "mlrb/models/metering.py", "mlrb/models/prices.py",
             "tests/fake_llm_server.py"),
)  # fmt: skip


if __name__ == "__main__":
    main()
