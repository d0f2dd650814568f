"""tools/readme_tables.py: the README's tables that a command prints are found and written whole,
on texts whose answer is known (tests/test_committed_results.py holds the real README to the store)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from readme_tables import (  # noqa: E402
    frontier_block,
    replace_fenced,
    replace_markdown_table,
    study_block,
    write_unless_changed,
)

PRINTED = """study s: 2 of 2 trials
variant  2014 ExpRate  2016 ExpRate
a (baseline)  10.0  9.0
b  12.0  11.0

paired differences
a (baseline)  –  –
b  +2.0 [+1.0, +3.0]  +2.0

Validation beside the test years
variant  val
a (baseline)  8.0
b  9.0

the cost of a trial: 30 CPU-minutes
"""


def test_a_study_s_block_runs_from_its_header_to_the_last_difference_or_its_validation():
    assert study_block(PRINTED, ("a (baseline)", "b"), with_validation=False).splitlines() == [
        "variant  2014 ExpRate  2016 ExpRate", "a (baseline)  10.0  9.0", "b  12.0  11.0", "",
        "paired differences", "a (baseline)  –  –", "b  +2.0 [+1.0, +3.0]  +2.0"]
    assert study_block(PRINTED, ("a (baseline)", "b"), with_validation=True).splitlines()[-3:] == [
        "variant  val", "a (baseline)  8.0", "b  9.0"]
    with pytest.raises(ValueError, match="not a table and its differences"):
        study_block(PRINTED, ("a (baseline)", "b", "c", "d"), with_validation=False)


def test_the_fenced_block_after_the_command_is_replaced_and_nothing_else():
    text = "intro\n`hmer report --study s` prints it:\n\n```\nold\nrows\n```\n\nprose 10.0\n"
    assert replace_fenced(text, "hmer report --study s", "new") == \
        "intro\n`hmer report --study s` prints it:\n\n```\nnew\n```\n\nprose 10.0\n"
    with pytest.raises(ValueError, match="no fenced block"):
        replace_fenced(text, "hmer report --study t", "new")


def test_the_frontier_block_runs_from_the_count_of_points_to_the_budgets_last_row():
    printed = ("2 of 13 planned points finished; the study spent 3.0 CPU-hours on them\n| variant | pflop |\n"
               "|:--|--:|\n| a | 0.1 |\n\nWhere today's budgets sit:\n\n| budget | pflop |\n|:--|--:|\n"
               "| cpu budget | 0.2 |\nwrote frontier.md, frontier.csv and plots/frontier.png to out\n")
    block = frontier_block(printed).splitlines()
    assert block[0].startswith("2 of 13 planned points finished") and block[-1] == "| cpu budget | 0.2 |"


def test_the_nth_claims_table_is_replaced_to_its_last_row():
    text = "a\n| claim | x |\n|---|---|\n| d | 1 |\nbetween\n| claim | y |\n|---|---|\n| d | 2 |\n| e | 3 |\nend\n"
    new = "| claim | y |\n|---|---|\n| d | 4 |"
    assert replace_markdown_table(text, 1, new) == "a\n| claim | x |\n|---|---|\n| d | 1 |\nbetween\n" + new + "\nend\n"
    with pytest.raises(ValueError, match="2 claims table"):
        replace_markdown_table(text, 2, new)


def test_an_edit_made_while_the_reports_ran_is_not_written_over(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("read\n")
    assert write_unless_changed(readme, "read\n", "tables\n") and readme.read_text() == "tables\n"
    readme.write_text("edited meanwhile\n")
    assert not write_unless_changed(readme, "tables\n", "tables again\n")
    assert readme.read_text() == "edited meanwhile\n" and sorted(tmp_path.iterdir()) == [readme]
