"""SuperGLUE-style sub-tasks and the web-like text they draw on, for the tiny scale of
the tasks scored with `super-glue-lm-eval-v1` (MiniPile, Edge-LLM training).

Each sub-task's rows have the fields of its SuperGLUE dataset, so lm-eval's own YAML for
it renders them (see `suites.py`):

- boolq `{passage, question, label, idx}`: is a statement about the passage true?
  (label 1 = yes)
- copa `{premise, choice1, choice2, question, label, idx}`: which of two events is the
  cause (or effect) of the premise? (label = index of the right choice)
- rte `{premise, hypothesis, label, idx}`: does the premise entail the hypothesis?
  (label 0 = entailment)
- wic `{word, sentence1, sentence2, start1, end1, start2, end2, label, idx}`: is the word
  used in the same sense in both sentences? (label 1 = yes)

Labels are balanced, so a model without the skill scores 50%. A task's YAML names the
sub-tasks its hidden suite holds (`subtasks`; at tiny scale COPA alone: BoolQ, RTE and WiC
stayed at chance for every model this small, adding only noise).

The training text (`web_documents`) holds stories that state the causes and effects of
one seed's `World` (arbitrary laws, some stated far more often than others), quiz pages
about other stories in the BoolQ and RTE layouts, and sentences using each ambiguous word
in both senses; the hidden rows are generated separately and never appear in it. COPA's
rows ask every cause of the world equally often, so a score says how much of the world a
model learned, from its common laws to its rare ones.
"""

from __future__ import annotations

import pathlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlrb.task_kit.tiny_models import check_counts, check_known, tiny_params, train_byte_level_tokenizer, zipf_weights
from mlrb.tasks.from_scratch import suites
from mlrb.tasks.from_scratch.grammar import NAMES, capitalise

PRONOUNS = {"he": ("he", "his", "him"), "she": ("she", "her", "her")}
COLOURS = ["red", "blue", "green", "yellow", "black", "white"]
OBJECTS = ["ball", "cup", "hat", "kite", "box", "book", "bike", "coat", "shoe", "drum"]
PLACES = ["the garden", "the park", "the kitchen", "the school", "the shop", "the beach"]

# The world's causes and effects (COPA). A cause is a person doing something to a thing
# ("{s} painted the kite"), and each cause has one effect on that person, drawn per seed:
# arbitrary laws, which a model learns only from the text that states them. Text states some
# causes far more often than others (a Zipf law over a seeded ranking), so the share a
# model learns grows with its capacity and training; the hidden rows ask every cause alike.
ACTIONS = [
    "dropped",
    "painted",
    "washed",
    "hid",
    "sold",
    "found",
    "lost",
    "fixed",
    "bought",
    "threw",
    "cleaned",
    "opened",
    "wrapped",
    "moved",
    "borrowed",
    "carried",
]
HANDLED = [
    "glass",
    "ball",
    "cup",
    "hat",
    "kite",
    "box",
    "book",
    "bike",
    "coat",
    "shoe",
    "drum",
    "lamp",
    "chair",
    "clock",
    "spoon",
]
MAX_CAUSES = len(ACTIONS) * len(HANDLED)  # every action on every thing
# {p} the person's pronoun, {q} their possessive.
EFFECTS = [
    "{p} laughed",
    "{p} cried",
    "{p} went to bed",
    "{p} ate an apple",
    "{p} put on a coat",
    "{p} drank some water",
    "{p} got a prize",
    "{p} felt sick",
    "{p} walked to school",
    "{p} passed the test",
    "{p} bought a sweet",
    "{p} smiled all day",
    "{p} woke up",
    "{p} called a friend",
    "{p} sang a song",
    "{p} ran home",
    "{p} sat down",
    "{p} went to the doctor",
    "{p} stayed inside",
    "{p} read a story",
    "{p} took a bath",
    "{p} said sorry",
    "{p} felt proud",
    "{p} was late for lunch",
    "{q} friend was upset",
    "{q} mother was angry",
    "{q} father clapped",
    "{q} dog barked",
    "{q} hands got dirty",
    "{q} socks got wet",
    "{q} sister cheered",
    "{q} teacher said thank you",
    "{p} danced in the hall",
    "{p} jumped for joy",
    "{p} hid under the bed",
    "{p} wrote a letter",
    "{p} cooked some soup",
    "{p} fed the cat",
    "{p} shut the door",
    "{p} lost {q} voice",
    "{p} missed the bus",
    "{p} fell asleep",
    "{p} got a cold",
    "{p} washed {q} face",
    "{p} made a cake",
    "{p} told a joke",
    "{p} went to the park",
    "{p} played a game",
]


@dataclass(frozen=True)
class World:
    """One seed's causes, each with its effect and its weight in the training text."""

    causes: tuple[str, ...]  # "{s} painted the kite"
    effects: tuple[str, ...]  # causes[i] -> effects[i]
    weights: tuple[float, ...]  # how often text states causes[i] (relative)

    @classmethod
    def draw(cls, rng: random.Random, n_causes: int, zipf: float) -> World:
        every = [f"{{s}} {action} the {thing}" for action in ACTIONS for thing in HANDLED]
        if not 2 <= n_causes <= MAX_CAUSES:
            raise ValueError(f"causes must be between 2 and {MAX_CAUSES}, not {n_causes}")
        causes = rng.sample(every, n_causes)
        effects = [rng.choice(EFFECTS) for _ in causes]
        return cls(tuple(causes), tuple(effects), tuple(zipf_weights(rng, n_causes, zipf)))

    def stated(self, rng: random.Random) -> int:
        """A cause as text states it (by weight)."""
        return rng.choices(range(len(self.causes)), weights=self.weights)[0]

    def asked(self, rng: random.Random) -> int:
        """A cause as the hidden rows ask it (uniformly)."""
        return rng.randrange(len(self.causes))

    def other(self, rng: random.Random, i: int) -> int:
        """Another cause, with another effect: the wrong choice beside cause i."""
        while True:
            j = rng.randrange(len(self.causes))
            if self.effects[j] != self.effects[i]:
                return j


# Word -> its two senses, each a few sentences using it ({w} marks the word).
SENSES: dict[str, tuple[list[str], list[str]]] = {
    "bat": (
        [
            "The {w} flew out of the cave at night.",
            "A {w} sleeps upside down in the dark.",
            "The little {w} ate a moth.",
        ],
        [
            "He hit the ball with the {w}.",
            "She held the wooden {w} and waited for the throw.",
            "The player swung the {w}.",
        ],
    ),
    "bank": (
        [
            "They sat on the {w} of the river.",
            "Ducks rested on the muddy {w}.",
            "The boat came close to the {w} of the stream.",
        ],
        [
            "She put her coins in the {w}.",
            "The {w} gave him money for a house.",
            "He went to the {w} to save his money.",
        ],
    ),
    "bark": (
        ["The dog gave a loud {w}.", "We heard the {w} of the puppy.", "The angry {w} woke the baby."],
        [
            "The {w} of the old tree was rough.",
            "Moss grew on the {w} of the oak.",
            "He peeled the {w} from the branch.",
        ],
    ),
    "light": (
        [
            "Turn on the {w} in the kitchen.",
            "The {w} of the lamp was bright.",
            "She read a book by the {w} of a candle.",
        ],
        ["The box is {w} enough to carry.", "A feather is very {w}.", "He packed a {w} bag for the trip."],
    ),
    "ring": (
        ["She wore a gold {w} on her finger.", "He gave her a silver {w}.", "The {w} had a red stone."],
        ["We heard the {w} of the bell.", "The {w} of the phone woke him.", "The loud {w} came from the door."],
    ),
    "fly": (
        ["A {w} landed on the cake.", "The {w} buzzed around the fruit.", "She chased the {w} out of the room."],
        ["Birds {w} south in winter.", "The kids watched the planes {w} over the town.", "Kites {w} high in the wind."],
    ),
}


def _person(rng: random.Random) -> tuple[str, str]:
    gender = rng.choice(["he", "she"])
    return rng.choice(NAMES[gender]), gender


def _fill(template: str, subject: str, gender: str, pronoun: str | None = None) -> str:
    """The template about one person: {s} is `subject`, {p} `pronoun` (default: he/she)."""
    he, possessive, _ = PRONOUNS[gender]
    return template.format(s=subject, p=pronoun or he, q=possessive)


# ---- stories with facts to read (BoolQ, RTE) -------------------------------------


def _facts(rng: random.Random, n: int) -> list[tuple[str, str, str, str]]:
    """n (name, gender, colour, object) facts, each about a different person and object."""
    people = rng.sample([(name, gender) for gender in ("he", "she") for name in NAMES[gender]], n)
    objects = rng.sample(OBJECTS, n)
    return [(name, gender, rng.choice(COLOURS), obj) for (name, gender), obj in zip(people, objects, strict=True)]


def _passage(rng: random.Random, facts) -> str:
    sentences = []
    for name, gender, colour, obj in facts:
        pronoun = PRONOUNS[gender][0]
        sentences.append(f"{name} has a {colour} {obj}.")
        sentences.append(f"{capitalise(pronoun)} takes it to {rng.choice(PLACES)}.")
    return " ".join(sentences)


def _other_colour(rng: random.Random, colour: str) -> str:
    return rng.choice([c for c in COLOURS if c != colour])


def boolq_row(rng: random.Random, label: int) -> dict:
    facts = _facts(rng, 1)
    name, _, colour, obj = rng.choice(facts)
    asked = colour if label == 1 else _other_colour(rng, colour)
    return {"passage": _passage(rng, facts), "question": f"does {name.lower()} have a {asked} {obj}", "label": label}


def rte_row(rng: random.Random, label: int) -> dict:
    facts = _facts(rng, 1)
    name, _, colour, obj = rng.choice(facts)
    stated = colour if label == 0 else _other_colour(rng, colour)
    return {"premise": _passage(rng, facts), "hypothesis": f"{name} has a {stated} {obj}.", "label": label}


# ---- cause and effect (COPA) -----------------------------------------------------


def copa_row(rng: random.Random, world: World, label: int) -> dict:
    i = world.asked(rng)
    j = world.other(rng, i)
    name, gender = _person(rng)
    he = PRONOUNS[gender][0]
    if rng.random() < 0.5:  # "Tom painted the kite." What happened as a result?
        question, premise = "effect", _fill(world.causes[i], name, gender)
        right, wrong = _fill(world.effects[i], he, gender), _fill(world.effects[j], he, gender)
    else:  # "Tom went to bed." What was the cause?
        question, premise = "cause", _fill(world.effects[i], name, gender, pronoun=name)
        right, wrong = _fill(world.causes[i], he, gender), _fill(world.causes[j], he, gender)
    first, second = (right, wrong) if label == 0 else (wrong, right)
    return {
        "premise": capitalise(premise) + ".",
        "choice1": capitalise(first) + ".",
        "choice2": capitalise(second) + ".",
        "question": question,
        "label": label,
    }


# ---- words with two senses (WiC) -------------------------------------------------


def wic_row(rng: random.Random, label: int) -> dict:
    word = rng.choice(sorted(SENSES))
    senses = SENSES[word]
    first = rng.randrange(2)
    second = first if label == 1 else 1 - first
    one = rng.choice(senses[first])
    two = rng.choice([s for s in senses[second] if s != one])
    s1, s2 = one.format(w=word), two.format(w=word)
    start1, start2 = one.index("{w}"), two.index("{w}")
    return {
        "word": word,
        "sentence1": s1,
        "sentence2": s2,
        "start1": start1,
        "end1": start1 + len(word),
        "start2": start2,
        "end2": start2 + len(word),
        "label": label,
    }


# name -> (lm-eval format, row generator: (rng, world, label) -> row); labels 0 and 1.
SUBTASKS: dict[str, tuple[str, Callable[[random.Random, World, int], dict]]] = {
    "boolq": ("boolq", lambda rng, world, label: boolq_row(rng, label)),
    "copa": ("copa", copa_row),
    "rte": ("rte", lambda rng, world, label: rte_row(rng, label)),
    "wic": ("wic", lambda rng, world, label: wic_row(rng, label)),
}


def rows(rng: random.Random, world: World, subtask: str, n: int, exclude: set | None = None) -> list[dict]:
    """n distinct rows of a sub-task, labels alternating (balanced), none in `exclude`."""
    _, generate = SUBTASKS[subtask]
    out: list[dict] = []
    seen = set(exclude or ())
    for _ in range(100 * n):
        if len(out) == n:
            break
        row = generate(rng, world, len(out) % 2)
        key = _key(row)
        if key in seen:
            continue
        seen.add(key)
        out.append({**row, "idx": len(out)})
    if len(out) < n:
        raise ValueError(f"{subtask}: fewer than {n} distinct rows")
    rng.shuffle(out)
    return out


def _key(row: dict) -> str:
    return "|".join(str(row[k]) for k in sorted(row) if k not in ("idx", "label"))


# ---- training text ---------------------------------------------------------------


def quiz_page(rng: random.Random) -> str:
    """A reading-comprehension page in the layout the sub-tasks are asked in."""
    kind = rng.random()
    if kind < 0.5:
        row = boolq_row(rng, rng.randrange(2))
        return f"{row['passage']}\nQuestion: {row['question']}?\nAnswer: {['no', 'yes'][row['label']]}"
    row = rte_row(rng, rng.randrange(2))
    return f"{row['premise']}\nQuestion: {row['hypothesis']} True or False?\nAnswer: {['True', 'False'][row['label']]}"


def causal_story(rng: random.Random, world: World) -> str:
    """One cause and its effect, in one of the ways text links them."""
    name, gender = _person(rng)
    he = PRONOUNS[gender][0]
    i = world.stated(rng)
    cause, effect = world.causes[i], world.effects[i]
    form = rng.randrange(4)
    if form == 0:
        return f"{capitalise(_fill(effect, name, gender, pronoun=name))} because {_fill(cause, he, gender)}."
    first, then = capitalise(_fill(cause, name, gender)), _fill(effect, he, gender)
    return [f"{first}, so {then}.", f"{first} therefore {then}.", f"{first}. {capitalise(then)}."][form - 1]


def sense_sentence(rng: random.Random) -> str:
    word = rng.choice(sorted(SENSES))
    return rng.choice(rng.choice(SENSES[word])).format(w=word)


def web_documents(rng: random.Random, world: World, n: int, exclude: set | None = None) -> list[str]:
    """n documents of mixed text: causal stories, quiz pages (none equal to a hidden row),
    and sentences that use ambiguous words."""
    docs: list[str] = []
    exclude = exclude or set()
    while len(docs) < n:
        kind = rng.random()
        if kind < 0.8:
            docs.append(" ".join(causal_story(rng, world) for _ in range(rng.randint(2, 4))))
        elif kind < 0.9:
            page = quiz_page(rng)
            if page.split("\nQuestion:")[0] not in exclude:
                docs.append(page)
        else:
            docs.append(" ".join(sense_sentence(rng) for _ in range(rng.randint(2, 4))))
    return docs


def hidden_suite(rng: random.Random, world: World, subtasks: list[str], n_rows: int) -> tuple[dict[str, tuple], set]:
    """{sub-task: (format, rows)} of n_rows each, and the passages they use (to keep out of
    the training text)."""
    check_known("subtasks", subtasks, SUBTASKS)
    suite = {name: (SUBTASKS[name][0], rows(rng, world, name, n_rows)) for name in subtasks}
    passages = {row.get("passage") or row.get("premise") for _, items in suite.values() for row in items}
    return suite, passages


def instruction_rows(rng: random.Random, world: World, n: int, exclude: set | None = None) -> list[dict]:
    """n rows in Alpaca's format ({instruction, input, output}) about the same world: what
    follows from an event, what caused it, and reading questions (none about a hidden passage)."""
    out: list[dict] = []
    exclude = exclude or set()
    while len(out) < n:
        kind = rng.random()
        name, gender = _person(rng)
        he = PRONOUNS[gender][0]
        i = world.stated(rng)
        cause, effect = world.causes[i], world.effects[i]
        if kind < 0.4:
            out.append(
                {
                    "instruction": "Say what happened as a result.",
                    "input": capitalise(_fill(cause, name, gender)) + ".",
                    "output": capitalise(_fill(effect, he, gender)) + ".",
                }
            )
        elif kind < 0.8:
            out.append(
                {
                    "instruction": "Say what caused this.",
                    "input": capitalise(_fill(effect, name, gender, pronoun=name)) + ".",
                    "output": capitalise(_fill(cause, he, gender)) + ".",
                }
            )
        else:
            row = boolq_row(rng, rng.randrange(2))
            if row["passage"] not in exclude:
                out.append(
                    {
                        "instruction": "Answer the question about the text with yes or no.",
                        "input": f"{row['passage']}\nQuestion: {row['question']}?",
                        "output": ["no", "yes"][row["label"]],
                    }
                )
    return out


# ---- the builds of the tasks scored on this suite (mini_pile, edge_llm_training) -----------


# The parameters every builder of this suite takes (each builder adds its own).
SUITE_PARAMS = ("seed", "vocab_size", "causes", "zipf", "subtasks", "rows_per_subtask", "checkpoint_command")


@dataclass
class SuiteBuild:
    """A tiny build under way whose hidden evaluation is this suite (see `suite_build`)."""

    p: dict  # the builder's parameters
    public: pathlib.Path
    rng: random.Random
    world: World
    passages: set  # the suite's passages: no training text may hold one
    group: str
    counts: dict[str, int]  # rows per sub-task

    def documents(self, n: int) -> list[str]:
        return web_documents(self.rng, self.world, n, exclude=self.passages)

    def instructions(self, n: int) -> list[dict]:
        return instruction_rows(self.rng, self.world, n, exclude=self.passages)

    def tokenizer(self, texts: list[str]) -> Any:
        """The task's tokenizer, trained on texts and saved as public/tokenizer."""
        tokenizer = train_byte_level_tokenizer(texts, int(self.p["vocab_size"]))
        tokenizer.save_pretrained(self.public / "tokenizer")
        return tokenizer

    def facts(self, data: dict, tokenizer: Any) -> dict:
        """The manifest's facts: the parameters, the data files, the tokenizer and the suite."""
        return {
            "params": self.p,
            "data": data,
            "tokenizer": {"path": "public/tokenizer", "vocab_size": len(tokenizer)},
            "suite": {"group": self.group, "rows": self.counts},
        }


def check_suite_params(params: dict, names: tuple, task: str, sizes: tuple = ()) -> dict:
    """These builders' parameters (`tiny_params`; `names` must include SUITE_PARAMS): known
    sub-tasks, sizes that are whole numbers (the suite's and the builder's `sizes`) and a
    number of causes the world has."""
    p = tiny_params(params, names, task)
    check_known("subtasks", list(p["subtasks"]), SUBTASKS)
    check_counts(p, ["vocab_size", "causes", "rows_per_subtask", *sizes])
    if not 2 <= p["causes"] <= MAX_CAUSES:
        raise ValueError(f"causes must be between 2 and {MAX_CAUSES}, not {p['causes']}")
    return p


def suite_build(out_dir: pathlib.Path, params: dict, names: tuple, task: str, group: str) -> SuiteBuild:
    """The start these builders share: their parameters (`check_suite_params`), the seeded
    random stream, the world (`causes` of them, which text states as unevenly as `zipf` says)
    and the hidden suite written to hidden/ (`rows_per_subtask` rows of each of `subtasks`)."""
    p = check_suite_params(params, names, task)
    out_dir = pathlib.Path(out_dir)
    rng = random.Random(int(p["seed"]))
    world = World.draw(rng, int(p["causes"]), float(p["zipf"]))
    suite, passages = hidden_suite(rng, world, list(p["subtasks"]), int(p["rows_per_subtask"]))
    counts = suites.write_hidden_suite(out_dir / "hidden", group, suite)
    return SuiteBuild(p, out_dir / "public", rng, world, passages, group, counts)
