"""How far llm_efficiency's own anchor commands lie toward the forbidden instruction-tuned
sibling, over all tensors and in their worst tensor: the margins of its lineage rule.

    .venv/bin/python -m benchmarks.lineage_shares [--seeds 0,1,2,3] [--cache DIR] [--out benchmarks/lineage_shares.json]

Builds (or reuses, in --cache) the tiny assets, runs the baseline and the reference
command at each seed as the asset build does, and prints each run's share toward the
sibling over all tensors (limit `max_share_toward_instruction_tuned`) and its largest
per-tensor share with the tensor's name (limit `max_tensor_share_toward_instruction_tuned`).
An honest fine-tune must stay well inside both, at every seed.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks import results as results_page
from benchmarks.calibration import load_task
from benchmarks.results import Section, commands, load, provenance_table, table
from mlrb.tasks.handling import solutions_of


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "mlrb-tests")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    measured = results_page.provenance(sources=SECTION.sources)

    from mlrb.harness.assets import ensure_assets
    from mlrb.tasks import model_checks
    from mlrb.tasks.llm_efficiency.task import model_dir

    task = load_task("llm_efficiency")
    assets = ensure_assets(task, args.cache)
    spec = task.spec
    base = model_dir(assets, spec.allowed_base_models[0])
    sibling_name = spec.instruction_tuned_models[0]
    sibling = model_dir(assets, sibling_name)
    print(f"limits: {spec.max_share_toward_instruction_tuned:.0%} over all tensors, "
          f"{spec.max_tensor_share_toward_instruction_tuned:.0%} per tensor")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for anchor, command in task.anchors.commands.items():
            if anchor == "do_nothing":
                continue
            for seed in (int(s) for s in args.seeds.split(",")):
                work = solutions_of(task, assets / "public").run(command, Path(scratch) / f"{anchor}-{seed}", seed)
                shares = model_checks.shares_toward(work / task.cfg.submission, base, sibling)
                assert shares is not None, "the submission's tensors differ from the base's"
                overall, per_tensor = shares
                worst = max(per_tensor, key=per_tensor.__getitem__)
                rows.append({"anchor": anchor, "seed": seed, "share": round(overall, 4),
                             "worst_tensor": worst, "worst_tensor_share": round(per_tensor[worst], 4)})  # fmt: skip
                print(
                    f"{anchor:9s} seed {seed}: {overall:6.1%} overall, worst tensor {per_tensor[worst]:6.1%} ({worst})"
                )
    if args.out:
        limits = {"overall": spec.max_share_toward_instruction_tuned,
                  "per_tensor": spec.max_tensor_share_toward_instruction_tuned}  # fmt: skip
        figures = {"sibling": sibling_name, "limits": limits, "runs": rows, "measured": measured}
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
        print(results_page.update(args.out))


# -- its section of the results page (benchmarks/results.py) -----------------------------------


def lineage_section(bench_dir: Path) -> str:
    data = load(bench_dir, "lineage_shares.json")
    limits = data["limits"]
    rows = [[r["anchor"], str(r["seed"]), f"{r['share']:.1%}", f"{r['worst_tensor_share']:.1%}", f"`{r['worst_tensor']}`"]
            for r in data["runs"]]  # fmt: skip
    return "\n\n".join([
        "How far the task's own anchor commands lie from the base toward the forbidden instruction-tuned "
        f"sibling (`{data['sibling']}`), over all tensors (limit {limits['overall']:.0%}) and in their worst "
        f"tensor (limit {limits['per_tensor']:.0%}): an honest fine-tune must stay well inside both at every seed.",
        "Measured with:",
        commands("-m benchmarks.lineage_shares --seeds 0,1,2,3 --out benchmarks/lineage_shares.json"),
        "Output: `benchmarks/lineage_shares.json`.",
        table(["anchor", "seed", "over all tensors", "worst tensor", "which"], rows),
        provenance_table([("`lineage_shares.json`", data.get("measured"))]),
    ])  # fmt: skip


SECTION = Section(
    "llm_efficiency's lineage margins", order=30, reads=("lineage_shares.json",), render=lineage_section,
    sources=("mlrb/tasks/llm_efficiency", "mlrb/tasks/llm_merging/lineage.py", "mlrb/task_kit/tiny_models.py",
             "mlrb/tasks/solutions.py", "requirements.lock"),
)  # fmt: skip


if __name__ == "__main__":
    main()
