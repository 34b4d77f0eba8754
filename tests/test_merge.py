"""Results from many writers: probe jobs running at the same time each land in a database of their own, and
`featstore merge` folds them into one equal to the same runs written one after another into a single database
(atomic, idempotent, refusing other experiments and differing results); `featstore sql` reads several databases
as one without merging; `featstore export` writes Parquet that Polars reads back."""

from __future__ import annotations

import shutil
import subprocess
import sys

import duckdb
import numpy as np
import polars as pl
import pytest
from synthetic import class_clusters, write_feature_store

from conftest import digest, fails, run_cli

DIMS = [6, 8, 8]
SEEDS = (0, 1, 2)
# every column of each table that two separate invocations of the same job write alike (not when, not which
# stored weights version: that is a fresh id per invocation)
COMPARED = {
    "runs": "SELECT * EXCLUDE (created_at, params, probe_version), json_remove(params, '$.probe_version') AS params "
            "FROM runs",
    "predictions": "SELECT * FROM predictions", "decisions": "SELECT * FROM decisions", "folds": "SELECT * FROM folds",
    "probe_fits": "SELECT * EXCLUDE (info) FROM probe_fits", "model_outputs": "SELECT * FROM model_outputs",
    "images": "SELECT * FROM images", "anchors": "SELECT * FROM anchors",
    "meta": "SELECT * FROM meta",
}


def probe_args(store, db, seed):
    return ["probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", "linear:max_epochs=4",
            "--seed", seed, "--threads", "1", "--cross-fit", "2" if seed == 2 else "0", "--no-progress"]


def tables(db) -> dict[str, list[tuple]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {name: sorted(map(repr, con.execute(sql).fetchall())) for name, sql in COMPARED.items()}
    finally:
        con.close()


@pytest.fixture(scope="module")
def parallel(tmp_path_factory):
    """Three probe jobs at once into three databases, and the same three one after another into one."""
    root = tmp_path_factory.mktemp("merge")
    feats, labels = class_clusters(240, 4, DIMS, seed=3)
    store = write_feature_store(root / "s.zarr", feats, labels, 4, views={"noisy": [f + 0.5 for f in feats]},
                                chunk_rows=64)
    jobs = [subprocess.Popen([sys.executable, "-m", "featstore.cli.main", *map(str, probe_args(store, root /
                              f"job{s}.duckdb", s)), "--view", "all"], stderr=subprocess.PIPE, text=True)
            for s in SEEDS]
    for job in jobs:
        assert job.wait(timeout=600) == 0, job.stderr.read()[-2000:]
    for s in SEEDS:
        run_cli(*probe_args(store, root / "sequential.duckdb", s), "--view", "all")
    return root, store


def test_merging_parallel_jobs_equals_writing_them_one_after_another(parallel):
    root, _ = parallel
    target = root / "merged.duckdb"
    out = run_cli("merge", "--db", target, *[root / f"job{s}.duckdb" for s in SEEDS]).output
    assert "3 source(s) folded in, 6 probe run(s)" in out
    merged, sequential = tables(target), tables(root / "sequential.duckdb")
    for name in COMPARED:
        assert merged[name] == sequential[name], name
    assert len(merged["predictions"]) == 6 * 240 * len(DIMS)  # 3 jobs x 2 views, every image at every anchor
    before = digest(target)
    run_cli("merge", "--db", target, root / "job1.duckdb", root / "job1.duckdb")  # the same source twice, again
    assert digest(target) == before


def test_the_macros_read_several_databases_as_one(parallel):
    root, _ = parallel
    dbs = [x for s in SEEDS for x in ("--db", root / f"job{s}.duckdb")]
    together = run_cli("sql", *dbs, "--format", "csv",
                       "SELECT run_id, k, mean FROM decision_sweep(2) ORDER BY run_id, k").output
    alone = run_cli("sql", "--db", root / "sequential.duckdb", "--format", "csv",
                    "SELECT run_id, k, mean FROM decision_sweep(2) ORDER BY run_id, k").output
    assert together == alone and len(together.splitlines()) == 1 + 6 * 2
    assert "reach no other file" in fails("sql", *dbs, "ATTACH 'x.duckdb' AS x")
    assert "held by 2 of the databases" in fails("sql", "--db", root / "job0.duckdb", "--db",
                                                 root / "sequential.duckdb", "SELECT 1")


def test_refusals_leave_the_target_as_it_was(parallel, tmp_path):
    root, store = parallel
    target = tmp_path / "t.duckdb"
    run_cli("merge", "--db", target, root / "job0.duckdb")
    before = digest(target)
    # the same command again: same run id, other stored weights version -> other content
    again = tmp_path / "again.duckdb"
    run_cli(*probe_args(store, again, 0))
    line = fails("merge", "--db", target, root / "job1.duckdb", again)
    assert f"source {again} holds run synthetic/clean/linear:max_epochs=4 " in line and "--replace" in line
    assert digest(target) == before  # job1, the good source before it, was not folded in either: all or nothing
    # another image set
    feats, labels = class_clusters(50, 4, DIMS, seed=9)
    other_store = write_feature_store(tmp_path / "o.zarr", feats, labels, 4)
    other = tmp_path / "other.duckdb"
    run_cli(*probe_args(other_store, other, 5))
    assert "holds another experiment: its dataset" in fails("merge", "--db", target, other)
    # same images, other anchors for the model
    wider = write_feature_store(tmp_path / "w.zarr", [np.hstack([f, f]) for f in class_clusters(240, 4, DIMS, 3)[0]],
                                labels=class_clusters(240, 4, DIMS, seed=3)[1], n_classes=4)
    other_anchors = tmp_path / "anchors.duckdb"
    run_cli(*probe_args(wider, other_anchors, 7))
    line = fails("merge", "--db", target, other_anchors)
    assert "disagrees with the target on its anchors: model synthetic (run synthetic/clean/" in line
    assert digest(target) == before
    assert "does not exist" in fails("merge", "--db", target, tmp_path / "missing.duckdb")
    assert "the target database itself" in fails("merge", "--db", target, target)
    # --replace: the source's version wins
    out = run_cli("merge", "--db", target, again, "--replace").output
    assert "replaced 1 result(s)" in out
    con = duckdb.connect(str(target), read_only=True)
    version = con.execute("SELECT probe_version FROM runs WHERE run_id LIKE 'synthetic/clean/%'").fetchall()
    con.close()
    con = duckdb.connect(str(again), read_only=True)
    assert version == con.execute("SELECT probe_version FROM runs").fetchall()
    con.close()


def test_export_writes_parquet_partitioned_by_run(parallel, tmp_path):
    root, _ = parallel
    db = root / "sequential.duckdb"
    run_cli("export", "--db", db, "--to", tmp_path / "out")
    back = pl.read_parquet(tmp_path / "out" / "predictions" / "**" / "*.parquet", hive_partitioning=True)
    con = duckdb.connect(str(db), read_only=True)
    want = con.sql("SELECT run_id::VARCHAR AS run_id, image_id, anchor, pred, conf FROM predictions").pl()
    runs = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    con.close()
    order = ["run_id", "image_id", "anchor"]
    assert back.select(want.columns).sort(order).equals(want.sort(order))
    assert len(list((tmp_path / "out" / "predictions").iterdir())) == runs
    assert pl.read_parquet(tmp_path / "out" / "runs.parquet").height == runs
    assert "not an empty folder" in fails("export", "--db", db, "--to", tmp_path / "out")


def test_a_learned_gate_goes_with_its_run(parallel, tmp_path):
    """merge carries gates and their scores, refuses a differing gate of the same run (unless --replace), drops the
    target's gate when --replace brings the run with other predictions; export writes them."""
    import shutil

    root, store = parallel
    run_id = "synthetic/clean/linear:max_epochs=4"
    gated, other = tmp_path / "gated.duckdb", tmp_path / "other.duckdb"
    shutil.copy(root / "job0.duckdb", gated)
    shutil.copy(root / "job0.duckdb", other)
    run_cli("gate", "--db", gated, "--run", run_id)
    run_cli("gate", "--db", other, "--run", run_id, "--split", "test")
    target = tmp_path / "t.duckdb"
    run_cli("merge", "--db", target, root / "job0.duckdb", gated)
    gate_rows = "SELECT * FROM gate_scores ORDER BY ALL"
    want = duckdb.connect(str(gated), read_only=True).execute(gate_rows).fetchall()
    assert len(want) == 240 * len(DIMS)
    assert duckdb.connect(str(target), read_only=True).execute(gate_rows).fetchall() == want
    run_cli("merge", "--db", target, root / "job0.duckdb")  # the same run without a gate keeps the gate
    assert duckdb.connect(str(target), read_only=True).execute(gate_rows).fetchall() == want
    assert f"gate {run_id}" in fails("merge", "--db", target, other)
    run_cli("merge", "--db", target, other, "--replace")
    con = duckdb.connect(str(target), read_only=True)
    assert con.execute("SELECT trained_on FROM gates").fetchall() == [("test",)]
    con.close()
    again = tmp_path / "again.duckdb"  # the same job again: other stored weights, so another run
    run_cli(*probe_args(store, again, 0))
    run_cli("merge", "--db", target, again, "--replace")
    con = duckdb.connect(str(target), read_only=True)
    assert con.execute("SELECT count(*) FROM gates").fetchone()[0] == 0  # its gate learnt the old predictions
    assert con.execute("SELECT count(*) FROM gate_scores").fetchone()[0] == 0
    con.close()
    run_cli("export", "--db", gated, "--to", tmp_path / "out")
    assert pl.read_parquet(tmp_path / "out" / "gates.parquet").height == 1
    back = pl.read_parquet(tmp_path / "out" / "gate_scores" / "**" / "*.parquet", hive_partitioning=True)
    assert back.height == len(want)


def test_merge_carries_the_anchor_cka_matrices(parallel, tmp_path):
    """Each source's `featstore cka` rows land in the merged database as they are (other views and estimators side by
    side); a differing matrix under the same model, view and estimator is refused unless --replace, which keeps the
    source's."""
    import shutil

    root, store = parallel
    first, second = tmp_path / "first.duckdb", tmp_path / "second.duckdb"
    shutil.copy(root / "job0.duckdb", first)
    shutil.copy(root / "job1.duckdb", second)
    run_cli("cka", "--store", store, "--model", "synthetic", "--db", first, "--threads", "1", "--no-progress")
    run_cli("cka", "--store", store, "--model", "synthetic", "--db", second, "--view", "noisy", "--unbiased",
            "--threads", "1", "--no-progress")
    rows = "SELECT * FROM anchor_cka ORDER BY ALL"

    def read(db) -> list[tuple]:
        con = duckdb.connect(str(db), read_only=True)
        try:
            return con.execute(rows).fetchall()
        finally:
            con.close()

    want = sorted(read(first) + read(second))
    assert len(want) == 2 * len(DIMS) ** 2  # every ordered pair of anchors, once per source
    target = tmp_path / "t.duckdb"
    run_cli("merge", "--db", target, first, second)
    assert read(target) == want
    run_cli("merge", "--db", target, first)  # the same matrix again changes nothing
    assert read(target) == want
    con = duckdb.connect(str(second))
    con.execute("UPDATE anchor_cka SET cka = cka / 2 WHERE anchor_a <> anchor_b")
    con.close()
    assert "holds anchor CKA synthetic/noisy unbiased " in fails("merge", "--db", target, second)
    assert read(target) == want
    run_cli("merge", "--db", target, second, "--replace")
    assert read(target) == sorted(read(first) + read(second))


IDENTITY = "SELECT run_id, probe_id, probe_name, probe_version FROM runs ORDER BY run_id"


def test_a_source_written_before_the_identity_columns_merges_as_the_same_runs(parallel, tmp_path):
    """A source whose runs hold the probes' identity only inside params (every database written before runs had
    the columns) is no conflict beside the same runs in the target, and its runs get the columns from params."""
    root, _ = parallel
    old = shutil.copyfile(root / "job0.duckdb", tmp_path / "old.duckdb")
    con = duckdb.connect(str(old))
    expected = con.execute(IDENTITY).fetchall()
    assert all(probe_id and name and version for _, probe_id, name, version in expected)
    con.execute("UPDATE runs SET params = json_merge_patch(params, json_object('probe_id', probe_id, 'probe_name', "
                "probe_name, 'probe_version', probe_version))")  # where an older featstore kept them
    for column in ("probe_id", "probe_name", "probe_version"):
        con.execute(f"ALTER TABLE runs DROP COLUMN {column}")
    con.close()
    target = shutil.copyfile(root / "job0.duckdb", tmp_path / "target.duckdb")
    con = duckdb.connect(str(target))  # params as DuckDB spells JSON, as the upgrade rewrites them
    con.execute("UPDATE runs SET params = json(params)")
    con.close()
    before = digest(target)
    run_cli("merge", "--db", target, old)
    assert digest(target) == before  # the same runs: nothing to fold in
    fresh = tmp_path / "fresh.duckdb"
    run_cli("merge", "--db", fresh, old)
    con = duckdb.connect(str(fresh), read_only=True)
    assert con.execute(IDENTITY).fetchall() == expected
    assert con.execute("SELECT count(*) FROM runs WHERE list_has_any(json_keys(params), "
                       "['probe_id', 'probe_name', 'probe_version'])").fetchone()[0] == 0  # the columns hold them
    con.close()
