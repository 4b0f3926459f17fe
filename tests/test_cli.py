"""The command line: help, printed configs, and one clear line for every kind of bad input."""

from __future__ import annotations

import pytest

from conftest import run_cli

pytestmark = pytest.mark.fast


def test_help_lists_groups_and_choices(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    for line in (
        "task: baby_lm, edge_llm_compression, edge_llm_training, folder, harbor, llm_efficiency, llm_merging, math_reasoning, mini_pile",
        "sandbox: bwrap, docker, unconfined",
    ):
        assert line in result.stdout
    assert "budget: 1h, 24h, paper, smoke" in result.stdout


def test_help_lists_only_the_groups_a_user_chooses_from(tmp_path):
    """Not a group that only composes others (task/from_scratch: a part three tasks share), which
    Hydra's own help lists; the docs' commands page shows the same text (mlrb.cli.help_text)."""
    from mlrb.cli import help_text

    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    listed = result.stdout.split("== Config groups (group=choice) ==")[1].split("\n\n")[0]
    groups = [line.split(":")[0] for line in listed.strip().splitlines()]
    assert groups == ["agent", "budget", "launcher", "sandbox", "task", "tracking"]
    assert "from_scratch" not in result.stdout
    assert result.stdout == help_text() + "\n"


def test_cfg_job_prints_the_resolved_config(tmp_path):
    result = run_cli("--cfg", "job", "--resolve", "task=llm_merging", "budget=paper", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "name: llm_merging" in result.stdout
    # the paper budget takes the task's own time limit at the chosen scale
    assert "wall_time_s: 600" in result.stdout


def test_pretraining_tasks_show_their_shared_values_and_their_own(tmp_path):
    """baby_lm, mini_pile and edge_llm_training compose what they share from one file
    (task/from_scratch/shared.yaml, a Hydra defaults entry); the printed config is each
    task's whole config, and a task's own value wins over the shared one."""
    import yaml

    shown = {}
    for task in ("baby_lm", "mini_pile", "edge_llm_training"):
        result = run_cli("--cfg", "job", "--resolve", f"task={task}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        shown[task] = yaml.safe_load(result.stdout)["task"]
    for task, cfg in shown.items():
        assert cfg["name"] == task and "defaults" not in cfg
        tiny, full = cfg["scales"]["tiny"], cfg["scales"]["full"]
        assert (cfg["scale"], cfg["submission"], cfg["network"]) == ("tiny", "submission", False)
        assert tiny["time_limit_s"] == 600 and tiny["hardware"] == {
            "gpus": 0,
            "gpu_type": None,
            "cpus": 2,
            "memory_gb": 4,
        }
        assert tiny["assets"]["source"] == "build" and tiny["assets"]["vocab_size"] == 512
        assert tiny["known_checkpoints"] == ["mlrb/tiny-gpt2"] and tiny["score_timeout_s"] == 600
        assert tiny["eval"]["tasks"] == [] and tiny["eval"]["device"] == "cpu"
        assert full["time_limit_s"] == 86400 and full["assets"]["tokenizer"] == "gpt2"
        assert full["known_checkpoints"] == ["distilgpt2", "gpt2"] and full["eval"]["device"] == "cuda"
        assert "read-only" in tiny["prompt"]["additional_info"] and tiny["prompt"]["task"]
    for task in ("baby_lm", "mini_pile"):  # the shared values as they are
        tiny = shown[task]["scales"]["tiny"]
        assert (tiny["assets"]["seed"], tiny["eval"]["batch_size"], tiny["eval"]["dtype"]) == (0, 8, "float32")
        assert (tiny["max_params"], tiny["memory_limit_mb"], tiny["fp16_fp32_only"]) == (2000000, None, False)
        assert shown[task]["scales"]["full"]["assets"]["subsets"] == []
    edge = shown["edge_llm_training"]["scales"]  # its own values over the shared ones
    assert (edge["tiny"]["assets"]["seed"], edge["tiny"]["eval"]["batch_size"], edge["tiny"]["eval"]["dtype"]) == (
        1,
        1,
        "auto",
    )
    assert (edge["tiny"]["max_params"], edge["tiny"]["memory_limit_mb"], edge["tiny"]["fp16_fp32_only"]) == (
        None,
        7.953,
        True,
    )
    assert edge["full"]["assets"]["subsets"] == ["c4_combined_dataset", "alpaca_cleaned"]
    assert shown["baby_lm"]["scales"]["tiny"]["assets"]["train_words"] == 250000
    assert shown["mini_pile"]["scales"]["tiny"]["assets"]["train_docs"] == 24000


def test_full_scale_config_names_the_papers_setup(tmp_path):
    result = run_cli("--cfg", "job", "--resolve", "task.scale=full", "budget=paper", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "meta-llama/Llama-2-7b-hf" in out
    assert "- mmlu" in out
    assert "gpu_type: A100-40GB" in out
    assert "wall_time_s: 3600" in out  # merging + evaluation within 1 hour


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["task=nope"],
            "unknown task 'nope'; valid choices: baby_lm, edge_llm_compression, edge_llm_training, folder, harbor, llm_efficiency, llm_merging, math_reasoning, mini_pile",
        ),
        (
            ["agent=gpt5"],
            "unknown agent 'gpt5'; valid choices: baseline, claude, claude_code, codex, command, gpt4o, human, openai_compatible",
        ),
        (["budget=2h"], "unknown budget '2h'; valid choices: 1h, 24h, paper, smoke"),
        (["budget.wal_time_s=5"], "unknown config key 'budget.wal_time_s'; did you mean 'budget.wall_time_s'?"),
        (["sed=3"], "unknown config key 'sed'; did you mean 'seed'?"),
        (["budget.wall_time_s=-5"], "budget.wall_time_s must be positive, got -5.0"),
        (["budget.max_steps=0"], "budget.max_steps must be positive, got 0"),
        (["budget.max_usd=-1"], "budget.max_usd must be positive, got -1.0"),
        (["budget.wall_time_s=soon"], "invalid override 'budget.wall_time_s=soon'"),
        (["task.scale=huge"], "unknown scale 'huge' for task llm_merging; valid choices: full, plumbing, tiny"),
        (["task.scale=full"], "missing value for 'task.scales.full.assets.adapters'"),
        (["-m", "seed=1,2", "budget=smoke,bad"], "unknown budget 'bad'"),
        (["--cfg", "job", "task=math_reasoning", "--info"], "give only one of --run, --multirun, --cfg, --info"),
        (["task=folder"], "task.path is not set: give the task folder, e.g. task.path=/path/to/house-price"),
        (["task=folder", "task.path=/nonexistent"], "task.path '/nonexistent' is not a folder"),
        # A tiny builder's parameter is checked with the config, before anything is built.
        (
            ["task=llm_efficiency", "task.scales.tiny.assets.skills=[geography,nope]"],
            "task.scales.tiny.assets: skills: unknown ['nope']; choose from geography, zoology, chemistry, astronomy",
        ),
        (
            ["task=mini_pile", "task.scales.tiny.assets.subtasks=[boolx]"],
            "task.scales.tiny.assets: subtasks: unknown ['boolx']; choose from boolq, copa, rte, wic",
        ),
        (
            ["task=llm_merging", "task.scales.tiny.assets.n_test=8"],
            "task.scales.tiny.assets: n_dev and n_test must give at least 4 items per skill (3 skills)",
        ),
        (
            ["task=llm_merging", "task.scales.tiny.assets.n_test=abc"],
            "task.scales.tiny.assets: n_test must be a whole number above 0, not 'abc'",
        ),
        (
            ["task=baby_lm", "task.scales.tiny.assets.train_words=-5"],
            "task.scales.tiny.assets: train_words must be a whole number above 0, not -5",
        ),
        (
            ["task=edge_llm_training", "-m", "seed=1,2", "task.scales.tiny.assets.causes=1000"],
            "task.scales.tiny.assets: causes must be between 2 and 240, not 1000",
        ),
    ],
)
def test_bad_input_gets_one_clear_line_and_writes_nothing(tmp_path, args, expected):
    result = run_cli(*args, f"tracking.dir={tmp_path / 'mlruns'}", f"hydra.run.dir={tmp_path / 'run'}",
                     f"paths.cache_dir={tmp_path / 'cache'}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("mlrb: error: ")
    assert expected in lines[0]
    assert not (tmp_path / "mlruns").exists()  # no run half-written
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "cache").exists()  # nothing built


def test_help_does_not_import_ml_libraries(tmp_path):
    probe = (
        "import sys; sys.argv=['mlrb','--help']\n"
        "from mlrb.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy=[m for m in ('torch','transformers','mlflow','lm_eval','peft') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize(
    "flags_last, flags_first",
    [
        (
            ["task=llm_merging", "agent=claude", "-m", "seed=1,2,3"],
            ["-m", "task=llm_merging", "agent=claude", "seed=1,2,3"],
        ),
        (["seed=3", "--cfg", "job", "--resolve"], ["--cfg", "job", "--resolve", "seed=3"]),
        (["budget=1h", "-c", "hydra", "seed=2", "--resolve"], ["-c", "hydra", "--resolve", "budget=1h", "seed=2"]),
        (
            ["budget=1h", "-cd", "/tmp/mine", "seed=2", "--multirun"],
            ["-cd", "/tmp/mine", "--multirun", "budget=1h", "seed=2"],
        ),
        (["seed=1", "--info"], ["--info", "seed=1"]),
        (["seed=1", "--config-dir", "/tmp/mine", "--help"], ["--help", "--config-dir", "/tmp/mine", "seed=1"]),
    ],
)
def test_hydra_flags_may_come_before_or_after_the_overrides(flags_last, flags_first):
    """What goes to hydra.main means the same to Hydra's own parser (flags only before the
    overrides) wherever the user put the flags, and ends with the overrides."""
    from hydra._internal.utils import get_args_parser  # hydra.main's parser (private; tests only)

    from mlrb.cli import parse_command_line

    handed_to_hydra = parse_command_line(flags_last).for_hydra
    as_hydra_reads_it = get_args_parser().parse_args(handed_to_hydra)
    assert as_hydra_reads_it == get_args_parser().parse_args(parse_command_line(flags_first).for_hydra)
    assert as_hydra_reads_it == parse_command_line(flags_last).args
    overrides = [a for a in flags_first if "=" in a]
    assert handed_to_hydra[-len(overrides) :] == overrides  # Hydra takes its flags first


def test_the_flags_mlrb_reads_are_hydras_own():
    """HYDRA_FLAGS is what hydra.main's parser takes (names, arity, choices, defaults), read here
    from Hydra's private module so that the package never imports it: an upgrade of Hydra that
    changes a flag fails this test instead of a user's command line."""
    from hydra._internal.utils import get_args_parser

    from mlrb.cli import HydraFlagParser

    def flags(parser) -> dict:
        return {tuple(a.option_strings): (type(a).__name__, a.nargs, a.const, a.default,
                                          list(a.choices) if a.choices else None)
                for a in parser._actions if a.option_strings and "--version" not in a.option_strings}  # fmt: skip

    assert flags(HydraFlagParser()) == flags(get_args_parser())


def test_version_names_mlrb_and_hydra(tmp_path):
    import hydra

    result = run_cli("seed=1", "--version", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("mlrb ")
    assert result.stdout.strip().endswith(f"(Hydra {hydra.__version__})")


def test_cfg_after_the_overrides_prints_the_config(tmp_path):
    result = run_cli("task=llm_merging", "budget=1h", "--cfg", "job", "--resolve", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "name: llm_merging" in result.stdout and "wall_time_s: 3600" in result.stdout
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "outputs").exists()


def test_an_unknown_flag_is_one_line_naming_it(tmp_path):
    result = run_cli("seed=1", "--multrun", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["mlrb: error: unrecognized arguments: --multrun"]


def test_a_checked_config_is_validated_once_and_only_for_the_same_config():
    """A single run's config is validated by check_jobs before Hydra composes it again for the
    job; the job takes the typed form that check made (validating twice cost a single run about
    a tenth of a second), and only where what Hydra composed is the config that was checked."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mlrb import cli
    from mlrb.core.config import CONF_DIR, register_schema

    register_schema()
    cli.check_jobs(cli.parse_command_line(["seed=3", "budget=1h"]).args)
    ((_, typed),) = cli.CHECKED
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        other = cli.checked(compose(config_name="config", overrides=["seed=4", "budget=1h"]))
        same = cli.checked(compose(config_name="config", overrides=["budget=1h", "seed=3"]))
    GlobalHydra.instance().clear()
    assert other is not typed and (other.seed, other.budget.wall_time_s) == (4, 3600)
    assert same is typed and (same.seed, same.budget.wall_time_s) == (3, 3600)
    assert cli.CHECKED == []  # each checked config is handed out once
