"""The mini_pile task at tiny scale: the SuperGLUE-style rows and web text, a whole
baseline run through the CLI, and rule breakers against the scorer."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from conftest import baseline_run, run_cli, task_from_config


def load_task(**overrides):
    return task_from_config("mini_pile", **overrides)


@pytest.fixture(scope="module")
def assets(cache_dir) -> Path:
    from mlrb.harness.assets import ensure_assets

    return ensure_assets(load_task(), cache_dir)


# ---- data without assets ---------------------------------------------------------

SUPERGLUE_FIELDS = {
    "boolq": {"passage", "question", "label", "idx"},
    "copa": {"premise", "choice1", "choice2", "question", "label", "idx"},
    "rte": {"premise", "hypothesis", "label", "idx"},
    "wic": {"word", "sentence1", "sentence2", "start1", "end1", "start2", "end2", "label", "idx"},
}


def true_answer(name: str, row: dict, world) -> int:
    """The row's answer read from its text (and the world's laws), not from its label."""
    from mlrb.tasks.from_scratch import superglue

    if name == "boolq":  # "does tom have a red kite": yes if the passage says "Tom has a red kite."
        statement = row["question"].removeprefix("does ").replace(" have a ", " has a ", 1)
        return int(f"{statement}." in row["passage"].lower())
    if name == "rte":  # 0 = entailment: the passage states the hypothesis
        return 0 if row["hypothesis"] in row["premise"] else 1
    if name == "wic":  # 1 = both sentences use the word in the same sense

        def sense(sentence: str) -> int:
            senses = superglue.SENSES[row["word"]]
            return next(k for k in (0, 1) if any(t.format(w=row["word"]) == sentence for t in senses[k]))

        return int(sense(row["sentence1"]) == sense(row["sentence2"]))
    # copa: the choice that the world's law makes the cause (or effect) of the premise
    lawful = [choice for choice in (row["choice1"], row["choice2"]) if copa_choice_is_law(row, choice, world)]
    assert len(lawful) == 1, row
    return [row["choice1"], row["choice2"]].index(lawful[0])


def copa_choice_is_law(row: dict, choice: str, world) -> bool:
    from mlrb.tasks.from_scratch import superglue

    def told(template: str, gender: str) -> str:  # as a choice reads: about "he" or "she"
        return superglue.capitalise(superglue._fill(template, gender, gender)) + "."

    if row["question"] == "effect":  # the premise is the cause, told with a name
        thing_done = row["premise"].split(" ", 1)[1].rstrip(".")
        i = next(i for i, cause in enumerate(world.causes) if cause == "{s} " + thing_done)
        return choice in (told(world.effects[i], "he"), told(world.effects[i], "she"))
    # the choice is a cause; the premise must be that cause's effect
    thing_done = choice.split(" ", 1)[1].rstrip(".")
    i = next(i for i, cause in enumerate(world.causes) if cause == "{s} " + thing_done)
    name = row["premise"].split(" ", 1)[0]
    return any(
        row["premise"] == superglue.capitalise(superglue._fill(world.effects[i], name, g, pronoun=name)) + "."
        for g in ("he", "she")
    )


@pytest.mark.fast
def test_sub_task_rows_have_superglue_fields_and_balanced_labels():
    from mlrb.tasks.from_scratch import superglue

    world = superglue.World.draw(random.Random(0), 60, 1.0)
    suite, passages = superglue.hidden_suite(random.Random(0), world, list(SUPERGLUE_FIELDS), 40)
    assert {name: fmt for name, (fmt, _) in suite.items()} == {n: n for n in SUPERGLUE_FIELDS}
    for name, (_, rows) in suite.items():
        assert all(set(row) == SUPERGLUE_FIELDS[name] for row in rows), name
        # Each label is the answer its text gives, and half the answers are 1: a blind answer scores 50%.
        answers = [true_answer(name, row, world) for row in rows]
        assert answers == [row["label"] for row in rows], name
        assert sum(answers) == 20, name
    for row in suite["wic"][1]:
        assert row["sentence1"][row["start1"] : row["end1"]] == row["word"]
        assert row["sentence2"][row["start2"] : row["end2"]] == row["word"]
    for row in suite["copa"][1]:
        assert row["question"] in ("cause", "effect") and row["premise"].endswith(".")
    # The training text never holds a hidden passage.
    docs = superglue.web_documents(random.Random(1), world, 3000, exclude=passages)
    assert not any(doc.split("\nQuestion:")[0] in passages for doc in docs)


@pytest.mark.fast
def test_text_states_causes_unevenly_and_the_hidden_rows_ask_them_evenly():
    from collections import Counter

    from mlrb.tasks.from_scratch import superglue

    world = superglue.World.draw(random.Random(3), 60, 1.0)
    assert len(set(world.causes)) == 60
    # The text states every cause, some far more often than others.
    docs = superglue.web_documents(random.Random(4), world, 4000)
    text = " ".join(docs)
    stated = Counter()
    for cause in world.causes:
        stated[cause] = text.count(cause.removeprefix("{s} "))
        assert stated[cause] > 0
    ranked = [count for _, count in stated.most_common()]
    assert ranked[0] > 20 * ranked[-1]  # a Zipf law: the head far more often than the tail

    # The hidden rows ask each cause about as often; the right choice is the world's law.
    def told(template: str, gender: str) -> str:  # as a choice reads: about "he" or "she"
        return superglue.capitalise(superglue._fill(template, gender, gender)) + "."

    rows = superglue.rows(random.Random(5), world, "copa", 1200)
    asked = Counter()
    for row in rows:
        right = [row["choice1"], row["choice2"]][row["label"]]
        thing_done = (row["premise"] if row["question"] == "effect" else right).split(" ", 1)[1].rstrip(".")
        i = next(i for i, cause in enumerate(world.causes) if cause == "{s} " + thing_done)
        law = world.effects[i] if row["question"] == "effect" else world.causes[i]
        assert right in (told(law, "he"), told(law, "she")), row
        asked[i] += 1
    assert len(asked) == 60 and max(asked.values()) < 4 * min(asked.values())


@pytest.mark.fast
def test_full_scale_config_names_the_papers_setup(tmp_path):
    result = run_cli("--cfg", "job", "--resolve", "task=mini_pile", "task.scale=full", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())  # YAML folds long strings over lines
    for fact in ("dataset: AlgorithmicResearchGroup/minipile", "--tasks super-glue-lm-eval-v1", "- sglue_rte",
                 "--layers 6 --heads 12 --width 768 --context 1024", "- distilgpt2"):  # fmt: skip
        assert fact in out, fact


# ---- the task ------------------------------------------------------------------


@pytest.mark.system
def test_assets_hide_the_suite_and_the_baseline_beats_an_untrained_model(assets):
    public = {p.relative_to(assets / "public").as_posix() for p in (assets / "public").rglob("*") if p.is_file()}
    assert {"data/train.jsonl", "data/validation.jsonl", "data/test.jsonl", "tokenizer/tokenizer.json"} <= public
    first = json.loads((assets / "public" / "data" / "train.jsonl").read_text().splitlines()[0])
    assert set(first) == {"text"}
    suite = json.loads((assets / "hidden" / "suite.json").read_text())
    assert suite["subtasks"] == {"copa": "copa"}
    c = json.loads((assets / "hidden" / "calibration.json").read_text())
    assert abs(c["do_nothing_score"] - 0.5) < 0.05  # an untrained model is at chance
    # The baseline learns the causes the text states most; the wider reference more (on these
    # assets, by 0.096 between the build's 3-seed means; in benchmarks/calibration.json the
    # reference's lowest seed of five, 0.827, is 0.056 above the baseline's highest).
    assert c["baseline_score"] > c["do_nothing_score"] + 0.1
    assert c["reference_score"] > c["baseline_score"] + 0.05


@pytest.mark.system
def test_baseline_run_is_recorded_with_its_score(tmp_path, cache_dir, assets):
    metrics = baseline_run("mini_pile", tmp_path, cache_dir).data.metrics  # scores the build's anchor
    # The score is the accuracy on the hidden copa rows: a whole number of them right.
    rows = (assets / "hidden" / "suite" / "copa.jsonl").read_text().splitlines()
    right = metrics["score"] * len(rows)
    assert "score.copa" in metrics and right == pytest.approx(round(right), abs=1e-6) and 0 < round(right) < len(rows)


@pytest.mark.system
def test_the_public_checkpoint_and_empty_submissions_are_invalid(assets, tmp_path):
    sub = tmp_path / "submission"
    shutil.copytree(assets / "hidden" / "known_checkpoints" / "mlrb__tiny-gpt2", sub)
    report = load_task().judge.score(sub, assets, tmp_path / "w1")
    assert not report.valid and "pretrained weights" in report.reason
    assert report.details["pretrained_check"]["copied_from"]["mlrb/tiny-gpt2"]
    (tmp_path / "empty").mkdir()
    assert "config.json is missing" in load_task().judge.score(tmp_path / "empty", assets, tmp_path / "w2").reason
