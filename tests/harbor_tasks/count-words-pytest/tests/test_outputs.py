"""The agent's answer, read from the working directory: it runs none of the agent's code."""

from pathlib import Path


def test_the_count_is_written():
    assert Path("/app/count.txt").is_file()


def test_the_count_is_right():
    assert Path("/app/count.txt").read_text().strip() == "13"
