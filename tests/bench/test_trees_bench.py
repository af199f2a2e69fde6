"""benchmarks/trees.py: two checkouts raced on the same runs, in processes of their own
(timing is never asserted)."""

import json

import pytest

from benchmarks import trees
from tests.conftest import ROOT


def test_the_same_tree_twice_gives_every_row_and_the_same_outputs(small_runs, copy_run,
                                                                  monkeypatch, tmp_path):
    (tmp_path / "text.txt").write_text("the cat sat on the mat and then it ran away home\n" * 9)
    runs = {"lm": small_runs["decoder"][0], "translator": copy_run[0]}
    monkeypatch.setattr(trees, "make_runs", lambda work: runs)
    out = tmp_path / "trees.json"
    trees.main([str(ROOT), str(ROOT), "--work", str(tmp_path), "--rounds", "1",
                "--repeats", "1", "--no-smollm2", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert sorted(rows) == sorted([
        "lm: generate 64 tokens, batch 1", "lm: generate 64 tokens, 8 prompts",
        "translator: translate greedy, 32 sentences", "translator: translate beam 4, 32 sentences",
        "translator: training step, 32 rows"])
    assert all(row["same_outputs"] and row["first_s"] > 0 and row["second_s"] > 0
               for row in rows.values())


def test_a_folder_that_is_not_a_checkout_is_refused(copy_run, tmp_path):
    """The child would import the installed vaswani instead: refused, not timed."""
    (tmp_path / "text.txt").write_text("a b c d e f\n" * 9)
    with pytest.raises(SystemExit, match="not this tree's"):
        trees.child(tmp_path, tmp_path, copy_run[0], 1)


def test_a_side_may_be_a_revision_written_out_once(tmp_path):
    tree = trees.checkout("HEAD", tmp_path)
    assert (tree / "src" / "vaswani" / "nn" / "attention.py").is_file()
    assert trees.checkout("HEAD", tmp_path) == tree  # once
    assert trees.checkout(str(ROOT), tmp_path) == ROOT
    with pytest.raises(SystemExit, match="neither a folder nor a revision"):
        trees.checkout("no-such-revision", tmp_path)
