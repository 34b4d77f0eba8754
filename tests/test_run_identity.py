"""Run identity: every result-changing parameter names its run, probe seeds land side by side, and the store's
probe weights and the database's rows commit together (a failure on either side leaves the old pair)."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tarfile
from pathlib import Path

import duckdb
import numpy as np
import pytest
from synthetic import class_clusters, read_probe, write_feature_store

import featstore as fs
from featstore.analytics import db as fsdb
from featstore.analytics.queries import query
from featstore.compute.specs import RunOptions
from featstore.errors import FeatstoreError
from featstore.probing import run as probe_run
from featstore.probing.base import check_probe_name
from featstore.records import RunIdentity
from featstore.store.reader import FeatureStore
from featstore.store.writer import StoreWriter

from conftest import db_rows, fail_after_inserting, fails, run_cli

DIMS = [8, 16, 32]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    feats, labels = class_clusters(900, 5, DIMS, seed=4)
    path = tmp_path_factory.mktemp("ident") / "s.zarr"
    write_feature_store(path, feats, labels, 5, chunk_rows=300)
    return path


def probe(store, db, *args):
    return run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--no-progress", *args)


def test_parameters_name_runs_and_reruns_replace_only_their_own(store, tmp_path):
    db = tmp_path / "f.duckdb"
    probe(store, db)
    probe(store, db, "--variant", "linear:max_iterations=3")
    probe(store, db, "--variant", "linear:max_iterations=3.0,tol=0.002")  # the same parameters: replaces its own run
    probe(store, db, "--variant", "linear:max_iterations=3", "--seed", "1")
    probe(store, db, "--project-dim", "8")
    got = [r[0] for r in db_rows(db, "SELECT run_id FROM runs ORDER BY run_id")]
    assert got == ["synthetic/clean/linear", "synthetic/clean/linear:max_iterations=3",
                   "synthetic/clean/linear:max_iterations=3/seed1", "synthetic/clean/projected8"]
    assert db_rows(db, "SELECT count(*) FROM predictions")[0][0] == 4 * 900 * len(DIMS)
    fs = FeatureStore(store)
    assert set(fs.info().models["synthetic"].probes) >= {
        "linear@clean", "linear:max_iterations=3@clean", "linear:max_iterations=3-seed1@clean", "projected8@clean"}
    probe_id, params = db_rows(db, "SELECT probe_id, params FROM runs WHERE run_id = "
                                "'synthetic/clean/linear:max_iterations=3'")[0]
    params = json.loads(params)
    assert probe_id == "linear:max_iterations=3" and params["max_iterations"] == 3
    assert params["split_seed"] == 0
    short = read_probe(fs, "synthetic", "linear:max_iterations=3@clean", "anchor02")[0]
    default = read_probe(fs, "synthetic", "linear@clean", "anchor02")[0]
    assert not np.allclose(short, default)  # the default run was not overwritten by the shorter one


def test_probe_seed_is_not_the_split_seed_and_spread_is_one_query(store, tmp_path):
    db = tmp_path / "f.duckdb"
    for seed in (0, 1, 2):
        probe(store, db, "--seed", seed, "--variant", "linear:full_batch=0,tol=0.02")  # SGD: the seed shuffles
    splits = db_rows(db, "SELECT split, count(*) FROM images GROUP BY split ORDER BY split")
    assert splits == [("test", 270), ("train", 567), ("val", 63)]  # one split for every probe seed
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", db, "--split-seed", "5")
    assert "--split-seed 0" in line
    spread = {r[0]: r[1:] for r in db_rows(db, "SELECT statistic, seeds, seed_list, mean, std, min, max "
                                            "FROM seed_spread(2)")}
    assert set(spread) >= {"mean", "median", "std", "f_early", "f_mid", "f_late", "never_stable",
                           "stable_but_wrong", "accuracy@00", "accuracy@02"}
    summary = db_rows(db, "SELECT seed, s.mean FROM decision_summary(2) s JOIN runs USING (run_id) ORDER BY seed")
    means = np.array([m for _, m in summary])
    seeds, seed_list, mean, std, lo, hi = spread["mean"]
    assert seeds == 3 and seed_list == [0, 1, 2]
    assert mean == pytest.approx(means.mean()) and std == pytest.approx(means.std(ddof=1))
    assert (lo, hi) == (pytest.approx(means.min()), pytest.approx(means.max()))
    acc = db_rows(db, "SELECT avg((p.pred = i.label)::INT) FROM predictions p JOIN images i USING (image_id) "
                   "JOIN runs r USING (run_id) WHERE anchor = 2 AND split = 'test' GROUP BY r.seed ORDER BY r.seed")
    assert spread["accuracy@02"][2] == pytest.approx(np.mean([a for (a,) in acc]))
    assert std > 0 or spread["accuracy@00"][3] > 0  # different probe seeds do give different probes


QUICK = ("--variant", "linear:tol=0.02")
NAME = "linear:tol=0.02@clean"


def _state(store, db):
    fs = FeatureStore(store)
    weights = [read_probe(fs, "synthetic", NAME, f"anchor{a:02d}")[0] for a in range(len(DIMS))]
    preds = db_rows(db, "SELECT image_id, anchor, pred FROM predictions ORDER BY ALL")
    version = db_rows(db, "SELECT probe_version FROM runs")[0][0]
    return weights, preds, version


@pytest.mark.parametrize("failing_side", ["store", "database"])
def test_store_weights_and_db_rows_commit_together(store, tmp_path, monkeypatch, failing_side):
    db = tmp_path / "f.duckdb"
    fs = FeatureStore(store)
    # versions other databases' runs name (the other case's, on this module's store) are theirs: never touched
    others = set(fs.listed(f"synthetic/probes/{NAME}")) if "probes" in fs.listed("synthetic") else set()
    probe(store, db, *QUICK)
    weights, preds, version = _state(store, db)
    real_fit = probe_run.fit_probes

    def other_probes(*args, **kwargs):  # a rerun whose results differ, so that old and new can be told apart
        fitted = real_fit(*args, **kwargs)
        for f in fitted:
            f.bias[0] += 100.0
        return fitted

    monkeypatch.setattr(probe_run, "fit_probes", other_probes)
    if failing_side == "store":
        real_write = StoreWriter.write_probe

        def dying_write(self, key, name, anchor, *args):
            if anchor == "anchor02":
                raise OSError("disk full while writing weights")
            real_write(self, key, name, anchor, *args)

        monkeypatch.setattr(StoreWriter, "write_probe", dying_write)
    else:
        fail_after_inserting(monkeypatch, "predictions", "disk full while writing rows")
    with pytest.raises(OSError, match="disk full"):
        probe(store, db, *QUICK)
    after_w, after_p, after_v = _state(store, db)
    assert after_p == preds and after_v == version
    assert all(np.array_equal(a, b) for a, b in zip(after_w, weights, strict=True))
    group = FeatureStore(store).root["synthetic"]["probes"][NAME]
    assert {k for k, _ in group.groups()} == others | {version}  # the failed version is gone, the run's own stays

    monkeypatch.undo()
    monkeypatch.setattr(probe_run, "fit_probes", other_probes)
    probe(store, db, *QUICK)  # the same rerun, now succeeding: both sides move together
    new_w, new_p, new_v = _state(store, db)
    assert new_v != version and {k for k, _ in group.groups()} == others | {new_v}  # its own old version went
    bias = read_probe(store, "synthetic", NAME, "anchor00")[1]
    assert bias[0, 0] > 50  # the current weights are the ones that produced the new rows
    assert new_p != preds and all(p == 0 for _, _, p in new_p)  # bias +100 on class 0: every prediction is 0


def test_probes_stored_before_versions_existed_are_still_read(tmp_path):
    feats, labels = class_clusters(40, 3, [4, 5], seed=1)
    fs = StoreWriter(write_feature_store(tmp_path / "s.zarr", feats, labels, 3))
    old = fs.root["synthetic"].require_group("probes").require_group("linear@clean").require_group("anchor00")
    old.create_array("weight", shape=(1, 3, 4), dtype="float32")[:] = 1.0
    old.create_array("bias", shape=(1, 3), dtype="float32")[:] = 2.0
    weight, bias, _ = read_probe(fs, "synthetic", "linear@clean", "anchor00")
    assert weight.sum() == 12 and bias.sum() == 6


# ---- the typed identity: one record makes and parses run ids and probe names; the database holds it in columns ----

def _random_identity(rng: random.Random) -> RunIdentity:
    """An identity with the characters variant ids carry (',' ':' '=' '.' '-' '_') and names that look like the
    parts that follow them (a view called 'streamed', a variant called 'seed1')."""
    labels = ["linear", "knn", "projected64", "head-probe", "tuned-lens", "lens-direct", "a.b_c-d", "seed1", "cf2",
              "x-cf", "streamed", "train=x"]
    values = ["0.5", "1e-05", "-1", "euclidean", "lowest", "3", "0.002", "a1b2c3d4e5f6", "x-seed"]
    probe_id = rng.choice(labels)
    if rng.random() < 0.7:
        keys = rng.sample(["C", "C_step", "metric", "ties", "max_iterations", "tol", "refs", "dim"], rng.randint(1, 4))
        probe_id += ":" + ",".join(f"{k}={rng.choice(values)}" for k in sorted(keys))
    views = ["clean", "gaussian_noise-1", "brightness-5", "noise", "streamed", "cf3", "train=clean", "v.2"]
    view = rng.choice(views)
    return RunIdentity(rng.choice(["resnet50", "synthetic", "m", "vit_b_16.augreg", "m-1"]), view, probe_id,
                       view if rng.random() < 0.5 else rng.choice(views), rng.choice([0, 0, 2, 3, 10]),
                       rng.choice([0, 0, 1, 7, 12, 100]), rng.random() < 0.3)


def test_an_identity_makes_and_parses_its_run_id_and_probe_name():
    example = RunIdentity("resnet50", "gaussian_noise-1", "linear:max_epochs=12", "clean", 5, 1, True)
    assert example.run_id == "resnet50/gaussian_noise-1/linear:max_epochs=12/train=clean/cf5/seed1/streamed"
    assert example.probe_name == "linear:max_epochs=12-cf5-seed1-streamed@clean"
    plain = RunIdentity("m", "clean", "knn:metric=euclidean,ties=lowest", "clean")
    assert (plain.run_id, plain.probe_name) == ("m/clean/knn:metric=euclidean,ties=lowest",
                                                "knn:metric=euclidean,ties=lowest@clean")
    rng = random.Random(49)
    made = [_random_identity(rng) for _ in range(3000)]
    assert len({i.run_id for i in made}) == len(set(made))  # one id per identity, no two identities share one
    for identity in made:
        assert RunIdentity.parse(identity.run_id) == identity, identity
        assert RunIdentity.from_probe_name(identity.model, identity.view, identity.probe_name) == identity, identity
    # the ids the tests' own databases hold, as an older featstore wrote them
    for run_id in ("resnet18/clean/linear:max_epochs=3", "resnet18/gaussian_noise-1/linear:max_epochs=3/train=clean",
                   "m11/noise-1/linear/train=clean", "synthetic/clean/linear:max_iterations=3/seed1",
                   "synthetic/clean/projected8", "m/clean/knn:k=5,metric=euclidean,ties=lowest/cf3/seed2"):
        assert RunIdentity.parse(run_id).run_id == run_id


@pytest.mark.parametrize("bad", ["", "m", "m/clean", "m//linear", "m/clean/linear/", "m/clean/linear/cf0",
                                 "m/clean/linear/seed0", "m/clean/linear/seed01", "m/clean/linear/seed1/cf2",
                                 "m/clean/linear/train=clean", "m/clean/linear/streamed/seed1", "m/clean/linear/x",
                                 "m/clean/linear/cf2/cf2", "m/clean/linear-seed1", "m/clean/linear/train="])
def test_a_malformed_run_id_is_refused_in_one_line_naming_it(bad):
    with pytest.raises(FeatstoreError) as e:
        RunIdentity.parse(bad)
    assert repr(bad) in str(e.value) and "\n" not in str(e.value)


def test_a_probe_name_that_no_identity_makes_is_refused():
    for bad in ("linear", "linear@", "linear-cf2-cf2@clean", "linear-seed1-cf2@clean", "@clean", "a@b@c"):
        with pytest.raises(FeatstoreError, match="no probe name"):
            RunIdentity.from_probe_name("m", "clean", bad)
    with pytest.raises(FeatstoreError, match="probe_id='x-seed1'"):  # its name would read back as seed 1
        RunIdentity("m", "clean", "x-seed1", "clean")
    for name in ("lda-seed1", "x-cf3", "y-streamed"):  # refused as a variant's or an estimator probe's name
        with pytest.raises(FeatstoreError, match=f"name='{name}' ends like"):
            check_probe_name(name)
    assert check_probe_name("x-seed") == "x-seed" and check_probe_name("seed1") == "seed1"


def test_an_estimators_default_name_never_ends_like_a_cross_fit(monkeypatch):
    from featstore.probing import estimator_variant

    class Lda:
        pass

    for digest, name in (("3f2a9c01" + "0" * 56, "lda-3f2a9c01"), ("cf123456" + "7a" * 28, "lda-cf1234567a"),
                         ("cf0123456" + "0" * 55, "lda-cf012345")):  # '-cf0…' is no cross-fit part
        monkeypatch.setattr(estimator_variant, "estimator_digest", lambda _, digest=digest: digest)
        assert estimator_variant.default_name(Lda()) == name
        assert RunIdentity.from_probe_name("m", "clean", f"{name}@clean").probe_id == name


def _by_hand(run_id: str) -> dict:
    """A run id's parts, read without RunIdentity."""
    model, view, probe_id, *rest = run_id.split("/")
    out = {"model": model, "view": view, "probe_id": probe_id, "train_view": view, "cross_fit": 0, "seed": 0,
           "streamed": False}
    for part in rest:
        if part.startswith("train="):
            out["train_view"] = part[len("train="):]
        elif part == "streamed":
            out["streamed"] = True
        else:
            key = "cross_fit" if part.startswith("cf") else "seed"
            out[key] = int(part.lstrip("cfsed"))
    return out


IDENTITY = ("model", "view", "probe_id", "train_view", "cross_fit", "seed", "streamed")


@pytest.fixture(scope="module")
def typed_db(store, tmp_path_factory):
    """One database of a chosen-C linear probe, a pinned-C one with a seed and cross-fit, and knn (no C)."""
    db = tmp_path_factory.mktemp("typed") / "f.duckdb"
    probe(store, db, "--variant", "linear:tol=0.02")
    probe(store, db, "--variant", "linear:C=0.5,tol=0.02", "--seed", "1", "--cross-fit", "2")
    return db, fs.probe(store=store, model="synthetic", db=db, variant="knn", run=RunOptions(progress=False))


def test_a_database_holds_each_runs_identity_and_strength_in_typed_columns(typed_db):
    db, knn = typed_db
    columns = ", ".join(IDENTITY)
    runs = db_rows(db, f"SELECT run_id, {columns}, probe_name, probe_version, C, params FROM runs ORDER BY run_id")
    assert [r[0] for r in runs] == ["synthetic/clean/knn:metric=euclidean,ties=lowest",
                                    "synthetic/clean/linear:C=0.5,tol=0.02/cf2/seed1",
                                    "synthetic/clean/linear:tol=0.02"]
    for run_id, *typed, name, version, c, params in runs:
        params = json.loads(params)
        assert dict(zip(IDENTITY, typed, strict=True)) == _by_hand(run_id), run_id
        assert not {"probe_id", "probe_name", "probe_version", "streamed"} & params.keys()  # in columns only
        assert name == RunIdentity.parse(run_id).probe_name and version
        variant = typed[IDENTITY.index("probe_id")]  # its parameters, read by hand: C as the variant string pins it
        pinned = dict(kv.split("=") for kv in variant.partition(":")[2].split(",") if kv).get("C")
        assert c == (float(pinned) if pinned else None), run_id
    fits = db_rows(db, "SELECT run_id, fold, anchor, C, info FROM probe_fits ORDER BY ALL")
    assert len(fits) == len(DIMS) * (1 + 2 + 1)  # the cross-fit run's one per fold
    for run_id, fold, anchor, c, info in fits:
        assert c == json.loads(info).get("C"), (run_id, fold, anchor)
        if "knn" in run_id:
            assert c is None  # no L2 strength
        else:
            assert c == 0.5 if "C=0.5" in run_id else c > 0  # pinned, or the one the search chose
    assert knn.runs == ("synthetic/clean/knn:metric=euclidean,ties=lowest",) and list(knn) == list(knn.runs)
    assert knn.identities == (RunIdentity("synthetic", "clean", "knn:metric=euclidean,ties=lowest", "clean"),)
    assert fs.RunIdentity is RunIdentity


OLD_RUNS = """CREATE TABLE runs (
    run_id VARCHAR PRIMARY KEY, model VARCHAR, view VARCHAR, train_view VARCHAR, probe VARCHAR, params JSON,
    cross_fit INTEGER, seed INTEGER, n_images INTEGER, n_anchors INTEGER, store VARCHAR, created_at TIMESTAMP)"""


def test_an_older_database_is_upgraded_once_and_reads_the_same(typed_db, tmp_path):
    """A file as a featstore before the typed columns wrote it (identity only in runs.params, each fit's C only in
    probe_fits.info) reads the same columns read-only (the file untouched), merges into a new file and onto the
    same runs with them, and gains them on a write connection, once: after that, what params says is never copied
    over them again."""
    db, _ = typed_db
    runs_sql = "SELECT run_id, probe_id, probe_name, probe_version, streamed, C FROM runs ORDER BY run_id"
    fits_sql = "SELECT run_id, fold, anchor, C FROM probe_fits ORDER BY ALL"
    want_runs, want_fits = db_rows(db, runs_sql), db_rows(db, fits_sql)
    old = tmp_path / "old.duckdb"
    shutil.copy(db, old)
    con = duckdb.connect(str(old))
    con.execute("CREATE TABLE old_runs AS SELECT * EXCLUDE (probe_id, probe_name, probe_version, streamed, C) "
                "REPLACE (json_merge_patch(params, json_object('probe_id', probe_id, 'probe_name', probe_name, "
                "'probe_version', probe_version, 'streamed', streamed)) AS params) "
                "FROM runs; DROP TABLE runs;" + OLD_RUNS + "; INSERT INTO runs SELECT * FROM old_runs; "
                "DROP TABLE old_runs; CREATE TABLE old_fits AS SELECT * EXCLUDE (C) FROM probe_fits; "
                "DROP TABLE probe_fits; ALTER TABLE old_fits RENAME TO probe_fits")
    con.close()
    before = hashlib.sha256(old.read_bytes()).hexdigest()
    assert query(old, runs_sql).rows() == want_runs and query(old, fits_sql).rows() == want_fits
    assert hashlib.sha256(old.read_bytes()).hexdigest() == before
    for target in (tmp_path / "empty.duckdb", shutil.copy(db, tmp_path / "same.duckdb")):
        run_cli("merge", "--db", target, old)  # into a new file, and onto the same runs: no conflict of content
        assert db_rows(target, runs_sql) == want_runs and db_rows(target, fits_sql) == want_fits
    assert hashlib.sha256(old.read_bytes()).hexdigest() == before
    fsdb.connect(old).close()  # a write connection upgrades the file
    assert db_rows(old, runs_sql) == want_runs and db_rows(old, fits_sql) == want_fits
    con = duckdb.connect(str(old))
    con.execute("""UPDATE runs SET params = json_merge_patch(params, '{"probe_name": "other", "C": 9, "streamed":
                   true}')""")
    con.execute("UPDATE probe_fits SET info = json_merge_patch(info, '{\"C\": 9}')")
    con.close()
    fsdb.connect(old).close()  # upgraded already: the columns are the file's own now, not a copy of params
    assert db_rows(old, runs_sql) == want_runs and db_rows(old, fits_sql) == want_fits


def test_a_database_an_older_featstore_wrote_reads_its_identity_and_strengths_typed(tmp_path):
    """The format1 file of tests/data (identity only in params, no streamed or C column): every typed column reads
    what its run id and JSON say, read-only and after a write connection upgraded it."""
    with tarfile.open(Path(__file__).parent / "data" / "legacy-format1.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    db = tmp_path / "format1" / "featstore.duckdb"
    raw = db_rows(db, "SELECT run_id, params FROM runs ORDER BY run_id")
    want = [(run_id, *_by_hand(run_id).values(), json.loads(params).get("C") or None) for run_id, params in raw]
    held = db_rows(db, "SELECT run_id, fold, anchor, info FROM probe_fits ORDER BY ALL")
    fits = [(run_id, fold, anchor, json.loads(info).get("C")) for run_id, fold, anchor, info in held]
    assert len(want) == 2 and fits  # its fits predate the recorded C (None); the file made above holds some
    runs_sql = f"SELECT run_id, {', '.join(IDENTITY)}, C FROM runs ORDER BY run_id"
    fits_sql = "SELECT run_id, fold, anchor, C FROM probe_fits ORDER BY ALL"
    assert query(db, runs_sql).rows() == want and query(db, fits_sql).rows() == fits
    fsdb.connect(db).close()
    assert db_rows(db, runs_sql) == want and db_rows(db, fits_sql) == fits
