"""The agent's module, imported by name from the working directory: its code runs in pytest's process."""

from wordcount import count_words


def test_a_sentence():
    assert count_words("the quick brown fox") == 4


def test_spaces_and_newlines():
    assert count_words("  one\ntwo   three \n") == 3


def test_nothing():
    assert count_words("") == 0
