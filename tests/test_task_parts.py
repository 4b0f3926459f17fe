"""A task is made of parts that packaged tasks and task folders share (issue 36): its asset
builder (mlrb/tasks/builder.py), its anchors (mlrb/tasks/anchors.py, tested in
test_anchor_seeds.py), its rules for an attempt (mlrb/tasks/attempt_rules.py) and its judge
(mlrb/tasks/judge.py; a folder's choice of the best dev step runs in test_folder_tasks.py)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys

import pytest

from conftest import REPO
from mlrb.core.config import ConfigError
from mlrb.tasks.anchors import AnchorFailed
from mlrb.tasks.attempt_rules import Rules
from mlrb.tasks.base import ScoreReport
from mlrb.tasks.handling import build_assets, solutions_of
from test_anchor_seeds import seed_task, seeded

pytestmark = pytest.mark.fast


def download(out_dir, params):
    """A full scale fetched from the hub: the maker says it ran."""
    (out_dir / "public").mkdir(parents=True, exist_ok=True)
    return {"downloaded": params}


def test_the_builder_runs_the_maker_the_source_names_and_refuses_another_by_name(tmp_path):
    built = build_assets(seed_task(tmp_path, size=3), tmp_path / "built")
    calibration = json.loads((tmp_path / "built" / "hidden" / "calibration.json").read_text())
    assert "downloaded" not in built and built["calibration"] == calibration
    assert (calibration["baseline_seeds"], calibration["reference_score"]) == ([0.0, 1.0, 2.0], 11.0)  # seeds 0-2
    hub = seed_task(tmp_path, source="hub", size=3)
    fetched = seeded(hub.cfg, tmp_path / "starter", download=download)
    # The maker gets the scale's assets less what is not its own (the source, the anchors' seeds).
    assert fetched.builder.make(tmp_path / "fetched") == {"downloaded": {"size": 3}}
    with pytest.raises(ValueError, match=r"^unknown assets.source 'hub' for task seeded; valid: build$"):
        build_assets(hub, tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()


def test_a_build_that_fails_leaves_nothing_behind_and_says_which_anchor_seed(tmp_path):
    task = seed_task(tmp_path, scale={"reference_command": (
        'test "$MLRB_SEED" != 1 || { echo "no seed 1" >&2; exit 4; }; mkdir -p submission && echo 1 > submission/answer.txt'
    )})  # fmt: skip
    with pytest.raises(AnchorFailed) as failed:
        build_assets(task, tmp_path / "assets")
    assert (failed.value.seed, failed.value.ran) == (1, False)
    assert str(failed.value).endswith("exited 4: no seed 1")
    assert not (tmp_path / "assets").exists()  # a half-built folder would read as assets


def test_an_anchor_that_makes_an_invalid_submission_is_named_with_its_command_and_seed(tmp_path):
    task = seed_task(tmp_path, scale={"baseline_command": "mkdir -p submission && echo x > submission/answer.txt"},
                     score=lambda submission, assets, work_dir: scored_if_a_number(submission))  # fmt: skip
    with pytest.raises(AnchorFailed) as failed:
        build_assets(task, tmp_path / "assets")
    # The seeds run side by side and each is scored as it ends: the first to end is the one named.
    assert failed.value.seed in (0, 1, 2)
    assert str(failed.value) == (
        "calibration: `mkdir -p submission && echo x > submission/answer.txt` made an invalid submission "
        f"at seed {failed.value.seed}: answer.txt is not a number"
    )
    assert failed.value.ran and failed.value.reason == "answer.txt is not a number"


def scored_if_a_number(submission) -> ScoreReport:
    try:
        return ScoreReport(valid=True, reason="ok", score=float((submission / "answer.txt").read_text()))
    except ValueError:
        return ScoreReport.invalid("answer.txt is not a number")


def test_a_bad_builder_param_is_one_config_error_before_anything_is_built(tmp_path):
    with pytest.raises(ConfigError, match=r"^task\.scales\.tiny\.assets\.anchor_seeds must be a whole number"):
        seed_task(tmp_path, anchor_seeds=0).builder.check_params("tiny")
    from conftest import task_from_config
    from mlrb.core import registry

    task = task_from_config("llm_merging")
    task.cfg.scales["tiny"]["assets"]["skills"] = ["geography", "astrology"]
    with pytest.raises(ConfigError, match=r"^task\.scales\.tiny\.assets: .*astrology"):
        registry.load_task(task.cfg).builder.check_params("tiny")


def test_the_rules_say_what_is_scored_and_restore_the_configs_and_the_assets_read_only_files(tmp_path):
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "read_only_files.txt").write_text("# the task's own\n./eval.py\n\n  data/*  \n")
    rules = Rules("submission", read_only=("train.py",), read_only_listed_in="hidden/read_only_files.txt")
    assert rules.read_only_globs(tmp_path) == ["train.py", "eval.py", "data/*"]
    assert Rules("submission", read_only=("train.py",)).read_only_globs(tmp_path) == ["train.py"]
    assert rules.read_only_globs(tmp_path / "elsewhere") == ["train.py"]  # no list: the config's alone
    # A task's come from its config: the network is closed unless the config opens it.
    task = seed_task(tmp_path)
    assert (task.rules.submission, task.rules.network, task.rules.read_only) == ("submission", False, ())


def test_the_judge_scores_with_the_tasks_own_scorer_and_says_what_its_process_imports_and_may_take(tmp_path):
    from conftest import task_from_config

    merging = task_from_config("llm_merging", score_timeout_s=42)
    assert "lm_eval.evaluator" in merging.judge.imports and merging.judge.timeout_s == 42
    formalizing = task_from_config("math_reasoning")  # scored with BLEU and ROUGE-L: no lm-eval to import
    assert formalizing.judge.imports == () and formalizing.judge.device == "cpu"
    task = seed_task(tmp_path, score=lambda submission, assets, work_dir: scored_if_a_number(submission))
    (tmp_path / "submission").mkdir()
    (tmp_path / "submission" / "answer.txt").write_text("7")
    assert task.judge.score(tmp_path / "submission", tmp_path, tmp_path).score == 7.0
    # A packaged task scores the final workspace: its judge chooses no step.
    assert merging.judge.choose_snapshot(tmp_path, tmp_path, tmp_path, score_folder=scored_if_a_number) is None


def test_a_builder_module_that_cannot_import_what_it_needs_says_so_when_the_config_is_checked(tmp_path, monkeypatch):
    from mlrb.tasks.builder import AssetBuilder

    (tmp_path / "handmade").mkdir()
    (tmp_path / "handmade" / "__init__.py").write_text("")
    (tmp_path / "handmade" / "assets.py").write_text("import a_library_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    needs = AssetBuilder("handmade", {"size": 3}, makers={}, check="handmade.assets:check_params")
    with pytest.raises(ConfigError) as told:
        needs.check_params("tiny")
    assert str(told.value) == (
        "task handmade: its builder handmade.assets cannot be imported: No module named "
        "'a_library_not_installed'; install a_library_not_installed beside mlrb"
    )
    # The same line where the command line checks a config.
    from conftest import compose_config
    from mlrb.core.config import check_rules
    from mlrb.tasks import base

    monkeypatch.setattr(base, "builder_module", lambda module: "handmade.assets")
    with pytest.raises(ConfigError) as told:
        check_rules(compose_config("task=llm_merging"))
    assert str(told.value) == (
        "task llm_merging: its builder handmade.assets cannot be imported: No module named "
        "'a_library_not_installed'; install a_library_not_installed beside mlrb"
    )
    # No builder module at all (a task folder's case), or one without a check: nothing to check.
    AssetBuilder("folder", {}, makers={}, check="handmade.no_such_module:check_params").check_params("tiny")
    (tmp_path / "handmade" / "assets.py").write_text("SIZE = 3\n")
    monkeypatch.delitem(sys.modules, "handmade.assets", raising=False)
    AssetBuilder("handmade", {}, makers={}, check="handmade.assets:check_params").check_params("tiny")


def test_a_task_folder_is_made_of_the_same_parts_as_a_packaged_task_and_gives_its_own_of_each(tmp_path):
    from conftest import task_from_config
    from mlrb.tasks.anchors import Anchors
    from mlrb.tasks.base import Task
    from mlrb.tasks.builder import AssetBuilder
    from mlrb.tasks.judge import Judge
    from mlrb.tasks.solutions import Solutions
    from test_task_environments import folder_task

    mlrc = folder_task(REPO / "tests" / "folder_tasks" / "mlrc-mini")
    for task in (task_from_config("llm_merging"), mlrc):
        parts = (task.builder, task.anchors, task.rules, task.judge, solutions_of(task, tmp_path / "public"))
        assert [type(part) for part in parts] == [AssetBuilder, Anchors, Rules, Judge, Solutions]
    # The folder's own: its one maker, its baseline alone (measured one seed at a time), the
    # layout's read-only list, eval.py's scorer choosing the best dev step after main.py ran
    # apart, its prepared env/.
    assert list(mlrc.builder.makers) == ["build"]
    assert mlrc.anchors.commands == {"baseline": "python main.py -m my_method -p dev"} and mlrc.anchors.workers == 1
    assert mlrc.rules.read_only_listed_in == "hidden/read_only_files.txt"
    assert mlrc.judge.snapshot_chooser is not None and mlrc.judge.submission_command is not None
    assert solutions_of(mlrc, tmp_path / "public").starting_files == tmp_path / "public"
    # A task is a value of its parts, never subclassed: what differs between tasks is in their fields.
    assert type(mlrc) is Task and type(task_from_config("llm_merging")) is Task
    with pytest.raises(dataclasses.FrozenInstanceError):
        mlrc.judge = None  # type: ignore[misc]


def test_every_packaged_task_is_a_frozen_value_its_folder_makes_and_subclasses_nothing():
    import inspect

    from conftest import task_from_config
    from mlrb.core import registry
    from mlrb.tasks.base import Task

    for key in registry.task_folders():
        module = importlib.import_module(f"mlrb.tasks.{key}.task")
        assert callable(module.task), key  # the folder's function, which registry.load_task calls
        assert not [c for _, c in inspect.getmembers(module, inspect.isclass) if issubclass(c, Task) and c is not Task]
        if key not in registry.folder_loaders():
            assert type(task_from_config(key)) is Task


def test_a_task_is_the_competition_in_at_most_20_members_and_mlrb_s_running_of_it_is_apart():
    """`Task` holds what the competition defines (its config, rules, assets' maker, anchors, judge,
    the agent's start); how mlrb runs it is its `setup`, a value a task kind fills (a packaged task
    takes the defaults), and what mlrb does with it is handling.py's functions of it."""
    from conftest import task_from_config
    from mlrb.tasks.base import Setup, Task

    members = {f.name for f in dataclasses.fields(Task)} | {name for name in vars(Task) if not name.startswith("_")}
    assert len(members) <= 20, sorted(members)
    # mlrb's policy is not the competition's: none of its values is a member of the task itself
    policy = {f.name for f in dataclasses.fields(Setup)}
    assert policy >= {"builds_at_preflight", "run_settings", "workspace_at", "normalised_as", "normalisation"}
    assert not members & policy
    # a packaged task fills none of it: its setup is the defaults
    assert task_from_config("llm_merging").setup == Setup()
    # what a task kind sets is in its setup: a task folder builds at preflight and names its scale
    from test_task_environments import folder_task

    mlrc = folder_task(REPO / "tests" / "folder_tasks" / "mlrc-mini")
    assert (mlrc.setup.builds_at_preflight, mlrc.setup.normalised_as) == (True, "human_gap")
