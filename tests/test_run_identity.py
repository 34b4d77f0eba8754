"""Run identity: every result-changing parameter names its run, probe seeds land side by side, and the store's
probe weights and the database's rows commit together (a failure on either side leaves the old pair)."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest
from synthetic import class_clusters, read_probe, write_feature_store

from featstore.probing import run as probe_run
from featstore.store.reader import FeatureStore
from featstore.store.writer import StoreWriter

from conftest import fail_after_inserting, fails, run_cli

DIMS = [8, 16, 32]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    feats, labels = class_clusters(900, 5, DIMS, seed=4)
    path = tmp_path_factory.mktemp("ident") / "s.zarr"
    write_feature_store(path, feats, labels, 5, chunk_rows=300)
    return path


def probe(store, db, *args):
    return run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--no-progress", *args)


def rows(db, sql, params=()):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def test_parameters_name_runs_and_reruns_replace_only_their_own(store, tmp_path):
    db = tmp_path / "f.duckdb"
    probe(store, db)
    probe(store, db, "--variant", "linear:max_iterations=3")
    probe(store, db, "--variant", "linear:max_iterations=3.0,tol=0.002")  # the same parameters: replaces its own run
    probe(store, db, "--variant", "linear:max_iterations=3", "--seed", "1")
    probe(store, db, "--project-dim", "8")
    got = [r[0] for r in rows(db, "SELECT run_id FROM runs ORDER BY run_id")]
    assert got == ["synthetic/clean/linear", "synthetic/clean/linear:max_iterations=3",
                   "synthetic/clean/linear:max_iterations=3/seed1", "synthetic/clean/projected8"]
    assert rows(db, "SELECT count(*) FROM predictions")[0][0] == 4 * 900 * len(DIMS)
    fs = FeatureStore(store)
    assert set(fs.info().models["synthetic"].probes) >= {
        "linear@clean", "linear:max_iterations=3@clean", "linear:max_iterations=3-seed1@clean", "projected8@clean"}
    params = json.loads(rows(db, "SELECT params FROM runs WHERE run_id = 'synthetic/clean/linear:max_iterations=3'"
                             )[0][0])
    assert params["probe_id"] == "linear:max_iterations=3" and params["max_iterations"] == 3
    assert params["split_seed"] == 0
    short = read_probe(fs, "synthetic", "linear:max_iterations=3@clean", "anchor02")[0]
    default = read_probe(fs, "synthetic", "linear@clean", "anchor02")[0]
    assert not np.allclose(short, default)  # the default run was not overwritten by the shorter one


def test_probe_seed_is_not_the_split_seed_and_spread_is_one_query(store, tmp_path):
    db = tmp_path / "f.duckdb"
    for seed in (0, 1, 2):
        probe(store, db, "--seed", seed, "--variant", "linear:full_batch=0,tol=0.02")  # SGD: the seed shuffles
    splits = rows(db, "SELECT split, count(*) FROM images GROUP BY split ORDER BY split")
    assert splits == [("test", 270), ("train", 567), ("val", 63)]  # one split for every probe seed
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", db, "--split-seed", "5")
    assert "--split-seed 0" in line
    spread = {r[0]: r[1:] for r in rows(db, "SELECT statistic, seeds, seed_list, mean, std, min, max "
                                            "FROM seed_spread(2)")}
    assert set(spread) >= {"mean", "median", "std", "f_early", "f_mid", "f_late", "never_stable",
                           "stable_but_wrong", "accuracy@00", "accuracy@02"}
    summary = rows(db, "SELECT seed, s.mean FROM decision_summary(2) s JOIN runs USING (run_id) ORDER BY seed")
    means = np.array([m for _, m in summary])
    seeds, seed_list, mean, std, lo, hi = spread["mean"]
    assert seeds == 3 and seed_list == [0, 1, 2]
    assert mean == pytest.approx(means.mean()) and std == pytest.approx(means.std(ddof=1))
    assert (lo, hi) == (pytest.approx(means.min()), pytest.approx(means.max()))
    acc = rows(db, "SELECT avg((p.pred = i.label)::INT) FROM predictions p JOIN images i USING (image_id) "
                   "JOIN runs r USING (run_id) WHERE anchor = 2 AND split = 'test' GROUP BY r.seed ORDER BY r.seed")
    assert spread["accuracy@02"][2] == pytest.approx(np.mean([a for (a,) in acc]))
    assert std > 0 or spread["accuracy@00"][3] > 0  # different probe seeds do give different probes


QUICK = ("--variant", "linear:tol=0.02")
NAME = "linear:tol=0.02@clean"


def _state(store, db):
    fs = FeatureStore(store)
    weights = [read_probe(fs, "synthetic", NAME, f"anchor{a:02d}")[0] for a in range(len(DIMS))]
    preds = rows(db, "SELECT image_id, anchor, pred FROM predictions ORDER BY ALL")
    version = json.loads(rows(db, "SELECT params FROM runs")[0][0])["probe_version"]
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
