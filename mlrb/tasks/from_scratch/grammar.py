"""A tiny English for the from-scratch tasks' tiny scale: a lexicon with number and gender,
and sentence generators that obey its agreement rules (determiner-noun, subject-verb,
reflexive pronouns, across relative clauses).

The corpora are written in it, and BLiMP-style minimal pairs (`blimp.py`) break exactly
one rule of one such sentence, so telling the pair apart needs nothing but the grammar a
model learned from the corpus: an untrained model is at chance, a trained one is not.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from mlrb.task_kit.tiny_models import make_names, zipf_weights

NAMES = {
    "he": ["Tom", "Sam", "Ben", "Max", "Leo", "Jack", "Dan", "Paul", "Carl", "Ned"],
    "she": ["Mia", "Ana", "Lily", "Emma", "Zoe", "Kate", "Rose", "Sue", "Jane", "Nora"],
}
REFLEXIVE = {"he": "himself", "she": "herself", "it": "itself", "they": "themselves"}


@dataclass(frozen=True)
class Noun:
    singular: str
    plural: str
    gender: str  # the singular's pronoun: he, she or it
    irregular: bool = False

    def form(self, plural: bool) -> str:
        return self.plural if plural else self.singular

    def pronoun(self, plural: bool) -> str:
        return "they" if plural else self.gender


@dataclass(frozen=True)
class Verb:
    third_singular: str  # "runs"
    base: str  # "run"

    def agree(self, plural: bool) -> str:
        return self.base if plural else self.third_singular


def _nouns(rows: str, irregular: bool = False) -> list[Noun]:
    nouns = []
    for row in rows.strip().splitlines():
        singular, plural, gender = row.split()
        nouns.append(Noun(singular, plural, gender, irregular=irregular))
    return nouns


def _verbs(pairs: str) -> list[Verb]:
    return [Verb(*pair.split("/")) for pair in pairs.split()]


CREATURES = _nouns(
    """
    dog dogs it
    cat cats it
    bird birds it
    duck ducks it
    frog frogs it
    horse horses it
    boy boys he
    girl girls she
    king kings he
    queen queens she
    baby babies it
    """
)
IRREGULAR_CREATURES = _nouns(
    """
    child children it
    man men he
    woman women she
    mouse mice it
    goose geese it
    person people it
    """,
    irregular=True,
)
THINGS = _nouns(
    """
    ball balls it
    book books it
    cup cups it
    box boxes it
    apple apples it
    car cars it
    hat hats it
    shoe shoes it
    toy toys it
    cookie cookies it
    spoon spoons it
    block blocks it
    """
)
INTRANSITIVE = _verbs(
    "runs/run sleeps/sleep jumps/jump plays/play sings/sing cries/cry laughs/laugh swims/swim walks/walk sits/sit"
)
TRANSITIVE = _verbs(
    "sees/see likes/like wants/want finds/find holds/hold pushes/push takes/take throws/throw drops/drop needs/need"
)
REFLEXIVE_VERBS = _verbs("sees/see likes/like washes/wash helps/help hurts/hurt dries/dry hides/hide")
ADJECTIVES = ["big", "little", "red", "blue", "happy", "sad", "new", "old", "wet", "funny"]
SINGULAR_DETERMINERS = ["this", "that"]
PLURAL_DETERMINERS = ["these", "those"]
BE = Verb("is", "are")


def capitalise(text: str) -> str:
    return text[0].upper() + text[1:]


@dataclass(frozen=True)
class People:
    """The names a text uses, each with its gender and how often the text uses it."""

    names: dict[str, tuple[str, ...]]  # gender (he, she) -> names
    weights: dict[str, tuple[float, ...]]  # gender -> each name's relative frequency

    @classmethod
    def common(cls) -> People:
        """NAMES, used equally often."""
        return cls({g: tuple(names) for g, names in NAMES.items()}, {g: (1.0,) * len(n) for g, n in NAMES.items()})

    @classmethod
    def made_up(cls, rng: random.Random, n: int, zipf: float) -> People:
        """n made-up names, half of each gender (nothing in a name tells which), used as unevenly
        as a Zipf law of exponent `zipf` over a random ranking: a model learns the genders of
        more of them the more capacity and training it has."""
        taken = {
            word
            for nouns in (CREATURES, IRREGULAR_CREATURES, THINGS)
            for noun in nouns
            for word in (noun.singular, noun.plural)
        }
        words = [capitalise(word) for word in make_names(rng, n, taken)]
        weights = zipf_weights(rng, n, zipf)
        half = n // 2
        return cls(
            {"he": tuple(words[:half]), "she": tuple(words[half:])},
            {"he": tuple(weights[:half]), "she": tuple(weights[half:])},
        )

    def evenly(self) -> People:
        """The same names, each used equally often (as the hidden pairs use them)."""
        return People(self.names, {g: (1.0,) * len(names) for g, names in self.names.items()})


class Grammar:
    """Random phrases and sentences of the tiny English; every choice comes from `rng`, every
    name from `people` (default: NAMES, evenly)."""

    def __init__(self, rng: random.Random, people: People | None = None):
        self.rng = rng
        self.people = people or People.common()

    def pick(self, options):
        return self.rng.choice(options)

    def name(self, gender: str | None = None) -> tuple[str, str]:
        if gender is None:  # by how often each gender's names are used
            totals = {g: sum(w) for g, w in self.people.weights.items()}
            gender = self.rng.choices(list(totals), weights=list(totals.values()))[0]
        return self.rng.choices(self.people.names[gender], weights=self.people.weights[gender])[0], gender

    def determiner(self, plural: bool, demonstrative: bool = False) -> str:
        if demonstrative:
            return self.pick(PLURAL_DETERMINERS if plural else SINGULAR_DETERMINERS)
        by_number = PLURAL_DETERMINERS + ["some"] if plural else SINGULAR_DETERMINERS + ["a"]
        return self.pick(["the", "the", "my", "your"] + by_number)

    def noun_phrase(self, noun: Noun, plural: bool, demonstrative: bool = False) -> str:
        words = [self.determiner(plural, demonstrative)]
        if self.rng.random() < 0.25:
            words.append(self.pick(ADJECTIVES))
        words.append(noun.form(plural))
        if words[0] == "a" and words[1][0] in "aeiou":
            words[0] = "an"
        return " ".join(words)

    def creature(self) -> Noun:
        return self.pick(IRREGULAR_CREATURES) if self.rng.random() < 0.35 else self.pick(CREATURES)

    def subject(self):
        """(text, plural, pronoun): a name, or a noun phrase about a creature."""
        if self.rng.random() < 0.3:
            name, gender = self.name()
            return name, False, gender
        noun, plural = self.creature(), self.rng.random() < 0.5
        return self.noun_phrase(noun, plural), plural, noun.pronoun(plural)

    def object_phrase(self) -> str:
        noun = self.pick(THINGS) if self.rng.random() < 0.7 else self.creature()
        return self.noun_phrase(noun, self.rng.random() < 0.5)

    # ---- sentences -------------------------------------------------------------
    def sentence(self) -> str:
        kind = self.rng.random()
        subject, plural, pronoun = self.subject()
        if kind < 0.2:
            text = f"{subject} {self.pick(INTRANSITIVE).agree(plural)}"
        elif kind < 0.45:
            text = f"{subject} {self.pick(TRANSITIVE).agree(plural)} {self.object_phrase()}"
        elif kind < 0.55:
            text = f"{subject} {BE.agree(plural)} {self.pick(ADJECTIVES)}"
        elif kind < 0.7:
            text = f"{subject} {self.pick(REFLEXIVE_VERBS).agree(plural)} {REFLEXIVE[pronoun]}"
        elif kind < 0.85:
            text = self.relative_clause_sentence()
        elif kind < 0.93:  # a pronoun subject agrees too
            text = f"{pronoun} {self.pick(TRANSITIVE).agree(plural)} {self.object_phrase()}"
        else:
            return f"{capitalise(BE.agree(plural))} {subject} {self.pick(ADJECTIVES)}?"
        return capitalise(text) + "."

    def relative_clause_sentence(
        self, main_plural: bool | None = None, attractor_plural: bool | None = None, main_verb: str | None = None
    ) -> str:
        """ "The dog that the boys see runs": the main verb agrees with the head noun,
        not with the nearer noun inside the clause. Returns the sentence without its period."""
        rng = self.rng
        head, inner = self.creature(), self.creature()
        main_plural = rng.random() < 0.5 if main_plural is None else main_plural
        attractor_plural = rng.random() < 0.5 if attractor_plural is None else attractor_plural
        inner_verb = self.pick(TRANSITIVE).agree(attractor_plural)
        verb = main_verb or self.pick(INTRANSITIVE).agree(main_plural)
        return (
            f"{self.noun_phrase(head, main_plural)} that {self.noun_phrase(inner, attractor_plural)} "
            f"{inner_verb} {verb}"
        )

    def story(self, n_sentences: int) -> str:
        """A short paragraph: sentences about one named character, mixed with others."""
        name, gender = self.name()
        thing = self.pick(THINGS)
        lines = [f"{name} has {self.noun_phrase(thing, False)}.", f"{capitalise(gender)} likes it."]
        while len(lines) < n_sentences:
            if self.rng.random() < 0.3:
                verb = self.pick(REFLEXIVE_VERBS).agree(False)
                lines.append(f"{name} {verb} {REFLEXIVE[gender]}.")
            else:
                lines.append(self.sentence())
        return " ".join(lines)
