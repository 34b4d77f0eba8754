"""A database is one experiment (one store per model, one split), and so is every set of databases that
`featstore sql` reads as one or `featstore merge` folds together. Each case is a silent wrong answer on the code
before: the tests check the refusal, that nothing was written, and the numbers the refusal protects."""

from __future__ import annotations

import duckdb
import pytest
from synthetic import class_clusters, write_feature_store

from conftest import digest, fails, run_cli

DIMS = [6, 8, 8]
N = 120


def probe(store, db, *extra):
    return run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", "linear:tol=0.02",
                   "--threads", "1", "--no-progress", *map(str, extra))


def rows(db, sql):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Store a and store c hold one image set; c's model was built with other weights and has 2 anchors, not 3."""
    root = tmp_path_factory.mktemp("experiment")
    feats, labels = class_clusters(N, 4, DIMS, seed=3)
    a = write_feature_store(root / "a.zarr", feats, labels, 4, weights_id="torchvision:A", chunk_rows=64)
    c = write_feature_store(root / "c.zarr", [f * 2 + 1 for f in feats[:2]], labels, 4, weights_id="torchvision:B",
                            chunk_rows=64)
    return root, a, c


def test_a_database_records_its_store_and_refuses_a_probe_of_another(stores, tmp_path):
    """Case 3: `probe --store c.zarr --db x` after `--store a.zarr --db x` replaced x's anchors and model outputs
    with c's network's; now it is refused in one line naming the weights and the anchors, and nothing is written
    (neither x nor c's probes)."""
    _, a, c = stores
    x = tmp_path / "x.duckdb"
    probe(a, x)
    assert rows(x, "SELECT model, weights_id, anchors FROM model_sources") == [
        ("synthetic", "torchvision:A", " ".join(f"anchor{i:02d}:{d}" for i, d in enumerate(DIMS)))]
    images = rows(x, "SELECT images FROM model_sources")[0][0]
    assert images.count("=") == 3  # the store's checksums of image_id, label and path
    before = digest(x)
    line = fails("probe", "--store", c, "--model", "synthetic", "--db", x, "--threads", "1", "--no-progress")
    assert f"database {x} holds model 'synthetic' probed from another store" in line
    assert "weights torchvision:B where the database holds torchvision:A" in line
    assert "anchors (2: anchor00, anchor01) where the database holds (3: anchor00 … anchor02)" in line
    assert digest(x) == before
    from featstore.store.reader import FeatureStore

    assert "probes" not in FeatureStore(c).listed("synthetic")  # no weights were saved either
    # the anchors table still names a's anchors, the model outputs are a's head (argmax of one-hot logits = label)
    assert rows(x, "SELECT count(*) FROM anchors") == [(3,)]
    assert rows(x, "SELECT count(*) FROM model_outputs m JOIN images i USING (image_id) WHERE m.pred <> i.label"
                ) == [(0,)]


def test_a_database_from_before_sources_were_recorded_is_checked_by_its_anchors(stores, tmp_path):
    _, a, c = stores
    x = tmp_path / "old.duckdb"
    probe(a, x)
    con = duckdb.connect(str(x))
    con.execute("DROP TABLE model_sources")  # as an older featstore wrote it
    con.close()
    line = fails("probe", "--store", c, "--model", "synthetic", "--db", x, "--no-progress")
    assert "weights torchvision:B where the database holds torchvision:A" in line and "anchors (2:" in line
    # sql reads it beside a database of this version (its identity from its anchors and runs)
    y = tmp_path / "new.duckdb"
    probe(a, y, "--seed", "1")
    out = run_cli("sql", "--db", x, "--db", y, "--format", "csv", "SELECT count(*) AS n FROM runs").output
    assert out.split() == ["n", "2"]
    z = tmp_path / "other.duckdb"
    probe(c, z, "--seed", "2")
    assert "the weights model synthetic was probed from differs" in fails("sql", "--db", x, "--db", z, "SELECT 1")


def test_sql_refuses_databases_split_with_other_seeds(stores, tmp_path):
    """Case 1: a's run was scored against b's test split, which holds a's training images."""
    _, a, _ = stores
    da, db = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    probe(a, da)
    probe(a, db, "--split-seed", "1", "--seed", "1")
    con = duckdb.connect(":memory:")
    con.execute(f"ATTACH '{da}' AS a (READ_ONLY)")
    con.execute(f"ATTACH '{db}' AS b (READ_ONLY)")
    leaked = con.execute("SELECT count(*) FROM a.images x JOIN b.images y USING (image_id) "
                         "WHERE x.split = 'train' AND y.split = 'test'").fetchone()[0]
    con.close()
    assert leaked > 0  # what the union would have scored as test images
    line = fails("sql", "--db", da, "--db", db, "SELECT count(*) FROM runs")
    assert f"databases {da} and {db} are not one experiment: its split_seed differs (0 vs 1)" in line


def test_sql_and_merge_refuse_databases_probed_from_stores_of_other_weights(stores, tmp_path):
    """Case 2: model_outputs held both networks' heads (2N rows for N images) and head_agreement counted each image
    twice."""
    root, a, _ = stores
    feats, labels = class_clusters(N, 4, DIMS, seed=3)
    b_store = write_feature_store(tmp_path / "b.zarr", [f + 0.25 for f in feats], labels, 4,
                                  weights_id="torchvision:B", chunk_rows=64)
    da, db = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    probe(a, da)
    probe(b_store, db, "--seed", "1")
    line = fails("sql", "--db", da, "--db", db, "SELECT count(*) FROM model_outputs")
    assert "the weights model synthetic was probed from differs (torchvision:A vs torchvision:B)" in line
    line = fails("merge", "--db", tmp_path / "m.duckdb", da, db)
    assert f"source {db} disagrees with the target on its weights: model synthetic: torchvision:B in the source, " \
           "torchvision:A in the target" in line
    assert not (tmp_path / "m.duckdb").exists()  # a refused merge leaves no new database behind
    # one experiment still reads as one: two seeds of store a, the union holds N head rows, not 2N
    dc = tmp_path / "c.duckdb"
    probe(a, dc, "--seed", "1")
    out = run_cli("sql", "--db", da, "--db", dc, "--format", "csv", "SELECT count(*) AS n FROM model_outputs").output
    assert out.split() == ["n", str(N)]


def test_merge_refuses_a_database_featstore_did_not_write(stores, tmp_path):
    _, a, _ = stores
    source = tmp_path / "s.duckdb"
    probe(a, source)
    plain = tmp_path / "plain.duckdb"
    con = duckdb.connect(str(plain))
    con.execute("CREATE TABLE notes AS SELECT 1 AS x")
    con.close()
    before = digest(plain)
    line = fails("merge", "--db", plain, source)
    assert f"{plain} is a DuckDB database featstore did not write (it holds table notes)" in line
    assert digest(plain) == before  # no featstore table was added
    assert "is not a featstore database" in fails("probe", "--store", a, "--model", "synthetic", "--db", plain)
    assert digest(plain) == before


@pytest.mark.parametrize("names", [("x", "X"), ("select", "order")])
def test_sql_names_attached_databases_safely(stores, tmp_path, names):
    """Stems that are one DuckDB name (x, X) or keywords (select, order) were a traceback; each gets a name SQL
    can use, and the union holds every run of both."""
    _, a, _ = stores
    dbs = []
    for seed, name in enumerate(names):
        (tmp_path / str(seed)).mkdir()
        dbs.append(tmp_path / str(seed) / f"{name}.duckdb")
        probe(a, dbs[-1], "--seed", seed)
    args = [x for d in dbs for x in ("--db", d)]
    out = run_cli("sql", *args, "--format", "csv", "SELECT count(*) AS runs FROM runs").output
    assert out.split() == ["runs", "2"]
    out = run_cli("sql", *args, "--format", "csv", "SELECT database_name FROM duckdb_databases() "
                  "WHERE NOT internal AND database_name <> 'memory' ORDER BY 1").output.split()[1:]
    assert out == (["db_2", "x"] if names == ("x", "X") else ["db_1", "db_2"])
    first = out[1] if names == ("x", "X") else out[0]
    got = run_cli("sql", *args, "--format", "csv", f"SELECT count(*) AS n FROM {first}.predictions").output.split()
    assert got == ["n", str(N * len(DIMS))]


def versions(store, name="linear:tol=0.02@clean") -> set[str]:
    from featstore.store.reader import FeatureStore

    return set(FeatureStore(store).listed(f"synthetic/probes/{name}"))


def run_versions(db) -> dict[str, str]:
    return dict(rows(db, "SELECT run_id, probe_version FROM runs"))


def test_jobs_sharing_a_probe_name_keep_each_others_weights(tmp_path):
    """Case 8: `probe --db p0` then `probe --split-seed 1 --db p1` left p0's run naming a deleted version, and the
    one-job-per-view pattern (two jobs at once, each training on clean) left no weights at all; verify called the
    store sound. Now every job's version stays while a database's run names it, and verify --db lists the runs
    whose weights are gone."""
    import shutil
    import subprocess
    import sys

    feats, labels = class_clusters(N, 4, DIMS, seed=3)
    store = write_feature_store(tmp_path / "s.zarr", feats, labels, 4, views={"noisy": [f + 0.5 for f in feats]},
                                chunk_rows=64)
    p0, p1 = tmp_path / "p0.duckdb", tmp_path / "p1.duckdb"
    probe(store, p0, "--view", "all")
    probe(store, p1, "--split-seed", "1")
    v0, v1 = run_versions(p0), run_versions(p1)
    assert len(set(v0.values())) == 1 and set(v0.values()) | set(v1.values()) == versions(store)
    run_cli("verify", store, "--db", p0, "--db", p1)
    # a rerun of p0 predicting clean only: its clean run moves to a new version, its noisy run still names the old
    probe(store, p0)
    again = run_versions(p0)
    assert again["synthetic/noisy/linear:tol=0.02/train=clean"] == v0["synthetic/noisy/linear:tol=0.02/train=clean"]
    assert set(again.values()) | set(v1.values()) == versions(store) and len(versions(store)) == 3
    probe(store, p0, "--view", "all")  # now no run of p0 names the first version: it alone goes
    assert versions(store) == set(run_versions(p0).values()) | set(v1.values()) and len(versions(store)) == 2
    # the documented pattern: one job per view, at the same time, each its own database
    jobs = [subprocess.Popen([sys.executable, "-m", "featstore.cli.main", "probe", "--store", str(store), "--model",
                              "synthetic", "--db", str(tmp_path / f"v{i}.duckdb"), "--view", view, "--variant",
                              "linear:tol=0.02", "--threads", "1", "--no-progress"], stderr=subprocess.PIPE, text=True)
            for i, view in enumerate(("clean", "noisy"))]
    for job in jobs:
        assert job.wait(timeout=600) == 0, job.stderr.read()[-2000:]
    # the pattern's numbers, read as one by sql, are those of one job predicting both views into one database
    sweep = "SELECT run_id, k, mean, never_stable FROM decision_sweep(2) ORDER BY run_id, k"
    together = run_cli("sql", "--db", tmp_path / "v0.duckdb", "--db", tmp_path / "v1.duckdb", "--format", "csv",
                       sweep).output
    single = tmp_path / "single.duckdb"
    probe(store, single, "--view", "all")
    assert together == run_cli("sql", "--db", single, "--format", "csv", sweep).output
    assert len(together.splitlines()) == 1 + 2 * 2  # two views (runs) x k = 1, 2
    dbs = [p0, p1, tmp_path / "v0.duckdb", tmp_path / "v1.duckdb"]
    named = {v for db in dbs for v in run_versions(db).values()}
    assert len(named) == 4 and named | set(run_versions(single).values()) == versions(store)
    run_cli("verify", store, *[x for db in dbs for x in ("--db", db)])
    # weights that went missing (deleted by hand) are listed, run by run, and verify exits 1
    shutil.rmtree(tmp_path / "s.zarr" / "synthetic" / "probes" / "linear:tol=0.02@clean" / v1["synthetic/clean/"
                                                                                             "linear:tol=0.02"])
    result = run_cli("verify", store, "--db", p0, "--db", p1, ok=False)
    assert result.exit_code == 1
    assert f"{p1}: run synthetic/clean/linear:tol=0.02: its weights synthetic/probes/linear:tol=0.02@clean/" \
           f"{v1['synthetic/clean/linear:tol=0.02']} are missing" in result.output
    assert str(p0) + ":" not in result.output
