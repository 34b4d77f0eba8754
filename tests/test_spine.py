"""The rules the CLI and the Python API share, written once beneath both (analytics/selection.py): the one
stability window of a one-window result, the run a one-run command reads, `--run`'s comma list."""

from __future__ import annotations

import pytest

import featstore as fs
from featstore.analytics.selection import run_ids

from conftest import fails, run_cli


def test_one_window_is_one_rule_for_every_command(digits_linear, tmp_path):
    """The one k given; of several (the default among them) 2; a list without 2 refused, by compare, one image's
    timeline and the report alike (the report before it writes anything)."""
    db, _ = digits_linear
    results = fs.connect(db)
    assert [results.window(k) for k in (None, [1, 2, 3, 4], [1, 2, 3], 3, [4])] == [2, 2, 2, 3, 4]
    with pytest.raises(ValueError,
                       match=r"^k=\[3, 4\]: this command shows one stability window, .* give one, e.g. k=3$"):
        results.window([3, 4])
    with pytest.raises(fs.FeatstoreError, match="^k=12: .* at most 12 anchors"):
        results.window(12)
    for args in (["timeline", "--image", "3"], ["compare"], ["report", "--out", tmp_path / "r"]):
        assert "--k 3,4: this command shows one stability window" in fails(*args, "--db", db, "--k", "3,4")
    assert not (tmp_path / "r").exists()
    shown = run_cli("timeline", "--db", db, "--image", "3", "--k", "1,2,3").output
    assert "◆ at l*(2)" in shown.splitlines()[0]
    layer = results.sql("SELECT layer FROM decision_layers(2) WHERE image_id = 3")["layer"][0]
    marked = [line for line in shown.splitlines() if "◆" in line and "│" in line]
    assert len(marked) == 1 and marked[0].split("┆")[0].strip(" │") == str(layer)


def test_run_lists_keep_a_run_id_s_own_commas():
    assert run_ids("m/clean/knn:metric=euclidean,ties=lowest,m/clean/linear") == [
        "m/clean/knn:metric=euclidean,ties=lowest", "m/clean/linear"]
    assert run_ids(" m/clean/linear , ") == ["m/clean/linear"]
    several = ["m/clean/linear:C=0.25,max_epochs=7/seed1", "m/noise-1/knn:metric=euclidean,ties=lowest/train=clean",
               "m/clean/knn:k=5,refs=/data/s.zarr/cf2", "m/clean/linear"]
    assert run_ids(",".join(several)) == several  # a parameter's piece holds a '/' in its tail or its value
    assert run_ids("") is None and run_ids(None) is None and run_ids(["a/b/c"]) == ["a/b/c"]


def test_a_one_run_result_takes_the_only_run_or_names_them(digits_linear):
    db, _ = digits_linear
    only = fs.connect(db).sql("SELECT run_id FROM runs")["run_id"].to_list()
    assert len(only) == 1 and fs.connect(db).only_run() == only[0]
    assert fs.connect(db).only_run("any/given/run") == "any/given/run"  # a run given is taken as given


def test_the_api_checks_what_the_cli_s_parsers_check(digits_linear, digits_store):
    """Python callers pass no click parser: a negative per_pair, k as a string, a negative min_age (which would let
    gc remove a version a running probe is still writing) are one line naming the field, before anything runs;
    numpy integers are integers."""
    import numpy as np

    db, _ = digits_linear
    results = fs.connect(db)
    for call, said in ((lambda: results.compare(per_pair=-1), "per_pair=-1: "),
                       (lambda: results.compare(k="3,4"), "k='3,4': give stability windows as integers"),
                       (lambda: fs.gc(digits_store, min_age=-1), "min_age=-1: must be a number >= 0")):
        with pytest.raises(fs.FeatstoreError) as caught:
            call()
        assert str(caught.value).startswith(said), caught.value
    assert results.window(np.int64(3)) == 3 and results.window(np.array([1, 2, 3])) == 2
