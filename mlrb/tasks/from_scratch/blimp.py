"""BLiMP-style minimal pairs in the tiny English of `grammar.py`, in BLiMP's own format
(`sentence_good`, `sentence_bad`, `field`, `linguistics_term`, `UID`, `pair_id`).

Each phenomenon keeps BLiMP's name for it. A pair differs in one word that breaks one
agreement rule. Half of each phenomenon's pairs have the singular form correct and half
the plural, so a model with no grammar (say one that prefers shorter or more frequent
words) scores 50%.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from mlrb.tasks.from_scratch.grammar import (
    CREATURES,
    INTRANSITIVE,
    IRREGULAR_CREATURES,
    REFLEXIVE,
    REFLEXIVE_VERBS,
    THINGS,
    TRANSITIVE,
    Grammar,
    People,
    capitalise,
)

Pair = tuple[str, str]  # (good, bad)


def _determiner_noun(g: Grammar, nouns, plural: bool) -> Pair:
    name, _ = g.name()
    noun = g.pick(nouns)
    verb = g.pick(TRANSITIVE).agree(False)
    det = g.determiner(plural, demonstrative=True)
    return f"{name} {verb} {det} {noun.form(plural)}.", f"{name} {verb} {det} {noun.form(not plural)}."


def _subject_verb(g: Grammar, nouns, plural: bool) -> Pair:
    subject = g.noun_phrase(g.pick(nouns), plural)
    verb = g.pick(INTRANSITIVE)
    return capitalise(f"{subject} {verb.agree(plural)}."), capitalise(f"{subject} {verb.agree(not plural)}.")


def determiner_noun_agreement_1(g: Grammar, plural: bool) -> Pair:
    return _determiner_noun(g, THINGS + CREATURES, plural)


def determiner_noun_agreement_irregular_1(g: Grammar, plural: bool) -> Pair:
    return _determiner_noun(g, IRREGULAR_CREATURES, plural)


def regular_plural_subject_verb_agreement_1(g: Grammar, plural: bool) -> Pair:
    return _subject_verb(g, CREATURES, plural)


def irregular_plural_subject_verb_agreement_1(g: Grammar, plural: bool) -> Pair:
    return _subject_verb(g, IRREGULAR_CREATURES, plural)


def anaphor_gender_agreement(g: Grammar, plural: bool) -> Pair:
    # "Tom hurts himself." / "Tom hurts herself."; `plural` picks the gender here (he / she).
    gender = "she" if plural else "he"
    name, _ = g.name(gender)
    verb = g.pick(REFLEXIVE_VERBS).agree(False)
    other = "he" if gender == "she" else "she"
    return f"{name} {verb} {REFLEXIVE[gender]}.", f"{name} {verb} {REFLEXIVE[other]}."


def anaphor_number_agreement(g: Grammar, plural: bool) -> Pair:
    verb = g.pick(REFLEXIVE_VERBS)
    if plural:
        noun = g.pick(CREATURES + IRREGULAR_CREATURES)
        subject = capitalise(g.noun_phrase(noun, True))
        return f"{subject} {verb.agree(True)} themselves.", f"{subject} {verb.agree(True)} {REFLEXIVE[noun.gender]}."
    name, gender = g.name()
    return f"{name} {verb.agree(False)} {REFLEXIVE[gender]}.", f"{name} {verb.agree(False)} themselves."


def distractor_agreement_relative_clause(g: Grammar, plural: bool) -> Pair:
    # The noun inside the clause has the other number: an attractor for the main verb.
    verb = g.pick(INTRANSITIVE)
    good = g.relative_clause_sentence(plural, not plural, verb.agree(plural))
    bad = good[: -len(verb.agree(plural))] + verb.agree(not plural)
    return capitalise(good) + ".", capitalise(bad) + "."


# UID -> (generator, BLiMP field, BLiMP linguistics term)
PHENOMENA: dict[str, tuple[Callable[[Grammar, bool], Pair], str, str]] = {
    "determiner_noun_agreement_1": (determiner_noun_agreement_1, "morphology", "determiner_noun_agreement"),
    "determiner_noun_agreement_irregular_1": (
        determiner_noun_agreement_irregular_1,
        "morphology",
        "determiner_noun_agreement",
    ),
    "regular_plural_subject_verb_agreement_1": (
        regular_plural_subject_verb_agreement_1,
        "morphology",
        "subject_verb_agreement",
    ),
    "irregular_plural_subject_verb_agreement_1": (
        irregular_plural_subject_verb_agreement_1,
        "morphology",
        "subject_verb_agreement",
    ),
    "anaphor_gender_agreement": (anaphor_gender_agreement, "morphology", "anaphor_agreement"),
    "anaphor_number_agreement": (anaphor_number_agreement, "morphology", "anaphor_agreement"),
    "distractor_agreement_relative_clause": (
        distractor_agreement_relative_clause,
        "morphology",
        "subject_verb_agreement",
    ),
}


def minimal_pairs(rng: random.Random, uid: str, n: int, people: People | None = None) -> list[dict]:
    """n distinct pairs of one phenomenon, half with the singular (or he) form correct; names
    from `people` (default: NAMES), each equally often, however often the corpus uses it."""
    generate, field, term = PHENOMENA[uid]
    grammar, seen = Grammar(rng, (people or People.common()).evenly()), set()
    rows: list[dict] = []
    for _ in range(100 * n):
        if len(rows) == n:
            break
        plural = len(rows) % 2 == 1
        good, bad = generate(grammar, plural)
        if good in seen:
            continue
        seen.add(good)
        rows.append(
            {
                "sentence_good": good,
                "sentence_bad": bad,
                "field": field,
                "linguistics_term": term,
                "UID": uid,
                "pair_id": len(rows),
            }
        )
    if len(rows) < n:
        raise ValueError(f"{uid}: the grammar has fewer than {n} distinct pairs")
    rng.shuffle(rows)
    return rows
