"""The durations the README and the tasks page quote are the benchmarks' figures, not a memory of
them: a first build's time is benchmarks/build_times.json's, a run's is benchmarks/overhead.json's.
When a benchmark is run again and its figure moves, the sentence that quotes it fails here until
it says the new figure (rounded as `about` allows)."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks.results import avx512_of
from conftest import REPO

pytestmark = pytest.mark.fast


def measured(name: str) -> dict:
    return json.loads((REPO / "benchmarks" / name).read_text())


def seconds(quoted: str, unit: str) -> float:
    return float(quoted) * (60 if unit.startswith("min") else 1)


def machine(figures: dict) -> str:
    """The measuring machine's CPU as the pages name it: "Intel(R) Xeon(R) Processor" is an Intel Xeon."""
    cpu = re.sub(r"\((R|TM)\)|\bProcessor\b|\bCPU\b.*", "", figures["measured"]["machine"]["cpu"])
    return re.sub(r"\s+", " ", cpu).strip()


def assert_about(quoted_s: float, measured_s: float, what: str) -> None:
    """`about` a figure: within 10 s of it, or 15% of it for figures over a minute."""
    assert abs(quoted_s - measured_s) <= max(10.0, 0.15 * measured_s), (
        f"{what}: the text says about {quoted_s:.0f} s, the benchmark measured {measured_s:.0f} s"
    )


def test_the_readme_s_first_build_and_later_run_are_the_measured_ones():
    readme = (REPO / "README.md").read_text()
    text = " ".join(readme.split())  # sentences wrap across lines
    build = re.search(
        r"The first run builds .*?\(about (\d+(?:\.\d+)?) (s|minutes?) on 2 idle CPU cores of an? ([^,]+),", text
    )
    later = re.search(r"a run after that takes about (\d+(?:\.\d+)?) (s|minutes?) there", text)
    assert build and later, "the README's Quick start no longer says how long the first run's build and a run take"
    assert "benchmarks/build_times.py" in text and "benchmarks/overhead.py" in text  # where each figure comes from
    assert_about(seconds(*build.groups()[:2]), measured("build_times.json")["seconds"]["llm_merging"], "first build")
    run_s = measured("overhead.json")["default"]["rows"]["run"]["wall_s"]["median"]
    assert_about(seconds(*later.groups()), run_s, "a later default run")
    # both on the machine named ("there")
    assert build.group(3) == machine(measured("build_times.json")) == machine(measured("overhead.json")["default"])


def test_the_tasks_page_s_range_of_first_builds_is_the_measured_one():
    text = " ".join((REPO / "docs" / "tasks" / "index.md").read_text().split())
    found = re.search(
        r"from about (\d+(?:\.\d+)?) (s|minutes?) \((\w+)\) to about (\d+(?:\.\d+)?) (s|minutes?) \((\w+)\)", text
    )
    assert found, "the tasks page no longer gives the range of first builds"
    low, low_unit, fastest, high, high_unit, slowest = found.groups()
    figures = measured("build_times.json")
    builds = figures["seconds"]
    # on the machine named, where every seeded build took the shipped calibration, as the page says
    assert f"on 2 idle cores of an {machine(figures)}," in text
    assert "took the other seeds from it" in text and set(figures["calibration"].values()) <= {"shipped", "no seeds"}
    assert (fastest, slowest) == (min(builds, key=builds.get), max(builds, key=builds.get))
    assert_about(seconds(low, low_unit), builds[fastest], f"{fastest}'s first build")
    assert_about(seconds(high, high_unit), builds[slowest], f"{slowest}'s first build")


def test_the_readme_s_test_times_are_the_measured_ones():
    """The tests' time on 2 cores, warm and the first time, and the whole of CI's from cold: the
    figures of benchmarks/suite_time.py's `default` and `ci-cold` runs."""
    text = " ".join((REPO / "README.md").read_text().split())
    found = re.search(r"The second line runs the fast and integration tiers: about (\d+) minutes on 2 CPU cores, "
                      r"about (\d+) minutes the first time", text)  # fmt: skip
    whole = re.search(r"`bash \.ci/run` .*? about (\d+) minutes from an empty cache on the \w+, using about (\d+) CPU minutes",
                      text)  # fmt: skip
    assert found and whole, "the README no longer says how long the tests and CI take"
    assert "benchmarks/suite_time.py" in text
    times = measured("suite_time.json")
    assert_about(seconds(found.group(1), "min"), times["default"]["session_s"], "the default run, warm")
    assert_about(seconds(found.group(2), "min"), times["ci-cold"]["default"]["session_s"], "the default run, cold")
    assert_about(seconds(whole.group(1), "min"), times["ci-cold"]["ci_s"], "the whole of .ci/run, cold")
    assert_about(seconds(whole.group(2), "min"), times["ci-cold"]["ci_cpu_s"], "the whole of .ci/run's CPU, cold")
    # the CPU minutes, which carry across machines as the time does not, and the machine that measured them
    cpu = re.search(r"They use about (\d+) CPU minutes, measured on an? ([^,]+), 2 cores", text)
    assert cpu, "the README no longer says how much CPU the tests use, and on which machine"
    default = times["default"]
    assert_about(seconds(cpu.group(1), "min"), sum(t["cpu_s"] for t in default["tiers"].values()), "the tests' CPU")
    first = re.search(r"the first time's run used (\d+)\)", text)
    assert first, "the README no longer says how much CPU the tests use the first time"
    cold = times["ci-cold"]["default"]["tiers"].values()
    assert_about(seconds(first.group(1), "min"), sum(t["cpu_s"] for t in cold), "the tests' CPU, the first time")
    assert cpu.group(2) == machine(default), "the README names another machine than the one that measured"
    # what a slower machine took: the same .ci/run measured there (benchmarks/suite_time.py --slower)
    slower = re.search(r"On a slower machine, an? ([^,]+?) without AVX-512 that needed (\d+\.\d) times that CPU, the same "
                       r"took about (\d+) minutes, and the second line about (\d+) minutes the first time", text)  # fmt: skip
    assert slower, "the README no longer says what a slower machine takes"
    there = times["slower_machine"]["ci-cold"]
    assert slower.group(1) == machine(there)
    assert avx512_of(there) is False  # as its provenance says, or the field recorded beside it
    assert abs(float(slower.group(2)) - there["ci_cpu_s"] / times["ci-cold"]["ci_cpu_s"]) < 0.05 + 1e-9
    assert_about(seconds(slower.group(3), "min"), there["ci_s"], "the whole of .ci/run on the slower machine")
    assert_about(
        seconds(slower.group(4), "min"), there["default"]["session_s"], "the default run on the slower machine"
    )


def test_the_tutorial_s_times_scores_and_cost_are_the_measured_and_configured_ones():
    """The tutorial's first build and later run (as the README's), the default run's score on the machine
    it names and the range of the machines measured (benchmarks/machine_spread.json), and what its paid
    step can cost and take: three runs of the smoke budget's caps, one after another."""
    import yaml

    text = " ".join((REPO / "docs" / "tutorial.md").read_text().split())
    build = re.search(r"builds the task's tiny models and data: about (\d+) (s|minutes?) on 2 idle cores of an? ([^.]+)\.",
                      text)  # fmt: skip
    later = re.search(r"Later runs reuse them and take about (\d+) (s|minutes?) there", text)
    assert build and later, "the tutorial no longer says how long the first build and a later run take"
    assert_about(seconds(*build.groups()[:2]), measured("build_times.json")["seconds"]["llm_merging"], "first build")
    assert build.group(3) == machine(measured("build_times.json")) == machine(measured("overhead.json")["default"])
    assert_about(seconds(*later.groups()), measured("overhead.json")["default"]["rows"]["run"]["wall_s"]["median"],
                 "a later default run")  # fmt: skip
    # the score it quotes is the baseline's on the path the libraries pick, on the machine it names
    from benchmarks.machine_spread import machines_of

    machines = machines_of(measured("machine_spread.json"))
    quoted = re.search(r"On an (Intel Xeon|AMD EPYC) it read `score (\d\.\d{4}) \(valid\)", text)
    assert quoted, "the tutorial no longer quotes the default run's score"
    picked = {m["cpu"]: m["tasks"]["llm_merging"]["paths"]["as picked"]["anchors"]["baseline"] for m in machines}
    (cpu,) = [c for c in picked if quoted.group(1).split()[-1] in c]
    assert f"{picked[cpu]:.4f}" == quoted.group(2)
    every = [p["anchors"]["baseline"] for m in machines for p in m["tasks"]["llm_merging"]["paths"].values()]
    assert f"from {min(every):.4f} to {max(every):.4f} on the machines measured" in text
    smoke = yaml.safe_load((REPO / "mlrb" / "conf" / "budget" / "smoke.yaml").read_text())
    cap, steps, minutes = smoke["max_usd"], smoke["max_steps"], smoke["wall_time_s"] / 60
    assert f"stops each run at ${cap:g}, {steps} steps or {minutes:g} minutes" in text
    assert f"at most ${3 * cap:g} and {3 * minutes:g} minutes in all" in text
    assert f"Only step 3 costs money: at most ${3 * cap:g}, in at most {3 * minutes:g} minutes" in text


def test_the_full_scale_guide_s_disk_figures_are_the_paper_load_s():
    """The full-scale guide's figures of a paper-scale run are benchmarks/paper_load.json's, as printed."""
    text = " ".join((REPO / "docs" / "full-scale.md").read_text().split())
    figures = measured("paper_load.json")["figures"]
    gib = 1 << 30
    found = re.search(r"The agent wrote (\d+\.\d\d) GiB and its workspace held (\d+\.\d\d) GiB", text)
    assert found, "the full-scale guide no longer says what the agent wrote"
    assert found.groups() == (f"{figures['agent_wrote_bytes'] / gib:.2f}", f"{figures['workspace_bytes'] / gib:.2f}")
    assert f"the snapshots took {figures['store_over_needed']:.2f} times the bytes still needed" in text
    unchanged = figures["unchanged_step_s"]
    assert (f"a step that changed nothing took {unchanged['median']:.2f} s of the harness's time "
            f"({unchanged['cpu_median']:.2f} s of CPU)") in text  # fmt: skip
    assert f"the harness's peak memory was {figures['harness_peak_mib']} MiB" in text
    assert f"the tracking store got {figures['uploaded_bytes'] / (1 << 20):.0f} MiB of the snapshots" in text
    assert f"{figures['steps'] - 1} steps" in text  # its last step is the final snapshot
