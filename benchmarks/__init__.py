"""The benchmarks: scripts that measure what the harness costs and how its tasks behave (first
asset builds, sweep scaling, per-run overhead, the anchors' seed noise, the metering proxy, the test
suite's time, the review's rules on a labelled set of runs), the GPU check, and `results.py`, which
writes their JSON outputs into RESULTS.md.

Each runs from the repository's root as `python -m benchmarks.NAME` (see its docstring); they
import one another through this package, and the scripted model API as `tests.fake_llm_server`.
"""
