"""`knn:refs=STORE` (Baldock et al.'s protocol: the network's training images vote) against scikit-learn's
KNeighborsClassifier fitted on the reference store's own features and labels, same k and metric: by default
(euclidean, ties to the lowest class) its `predict`, identical except where the k-th and (k+1)-th neighbours are
equally far at float32 precision; the old rule (cosine, ties to the nearer voters) against scikit-learn's
neighbours voting by that rule, every difference a tie; refusals of a reference store of other weights or anchors
(one line, exit 2, nothing written); the run records where its references came from, and refs is part of its id."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest
from sklearn.neighbors import KNeighborsClassifier
from synthetic import class_clusters, read_probe_arrays, write_feature_store
from test_knn import boundary, explained, nearer_voters

from featstore.probing.knn import location_digest
from featstore.store.reader import FeatureStore

from conftest import fails, run_cli

DIMS = [16, 24, 24]
N_REF = 400


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """One draw of class clusters split in two stores of the same model: 400 reference rows, 300 probed rows."""
    root = tmp_path_factory.mktemp("refs")
    feats, labels = class_clusters(700, 5, DIMS, seed=3)
    ref = write_feature_store(root / "ref.zarr", [f[:N_REF] for f in feats], labels[:N_REF], 5)
    probed = write_feature_store(root / "probed.zarr", [f[N_REF:] for f in feats], labels[N_REF:], 5)
    return root, ref, probed


def probe(store, db, variant: str, ok: bool = True):
    return run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", variant,
                   "--no-progress", "--threads", "1", ok=ok)


@pytest.mark.parametrize("k, metric, ties", [(30, "euclidean", "lowest"), (7, "cosine", "nearer")])
def test_references_from_another_store_equal_scikit_learn(stores, tmp_path, k, metric, ties):
    root, ref, probed = stores
    variant = f"knn:refs={ref}" + ("" if k == 30 else f",k={k},metric={metric},ties={ties}")
    db = tmp_path / "f.duckdb"
    probe(probed, db, variant)
    rid = "synthetic/clean/knn:" + ",".join(sorted(
        [f"refs={location_digest(str(ref))}", f"metric={metric}", f"ties={ties}"] + ([] if k == 30 else [f"k={k}"])))
    con = duckdb.connect(str(db), read_only=True)
    got = con.execute("SELECT pred, conf FROM predictions WHERE run_id = ? ORDER BY image_id, anchor",
                      [rid]).fetchnumpy()
    params = json.loads(con.execute("SELECT params FROM runs WHERE run_id = ?", [rid]).fetchone()[0])
    infos = [json.loads(i) for (i,) in con.execute("SELECT info FROM probe_fits WHERE run_id = ? ORDER BY anchor",
                                                   [rid]).fetchall()]
    con.close()
    assert params["refs"] == str(ref)
    assert {i["references_from"] for i in infos} == {str(ref)} and {i["references"] for i in infos} == {N_REF}
    fr, fp = FeatureStore(ref), FeatureStore(probed)
    ref_labels = fr.image_table()["label"]
    n = fp.num_images
    pred, conf = got["pred"].reshape(n, len(DIMS)), got["conf"].reshape(n, len(DIMS))
    ties = differ_total = 0
    for anchor in fp.anchors("synthetic"):
        refs = fr.read("synthetic", "clean", anchor.name).astype(np.float64)
        x = fp.read("synthetic", "clean", anchor.name).astype(np.float64)
        sk = KNeighborsClassifier(n_neighbors=k, metric=metric, algorithm="brute").fit(refs, ref_labels)
        expected = sk.predict(x)
        distance, index = sk.kneighbors(x, n_neighbors=k + 1)
        gap, tolerance = boundary(x, refs, distance, index, k, metric)
        tied = np.array([explained(gap[i], tolerance[i], ref_labels[index[i]], k) for i in range(n)])
        mine = pred[:, anchor.index]
        differ = np.flatnonzero(mine != expected)
        clear = gap > tolerance
        if ties == "lowest":  # scikit-learn's own rule: identical wherever the k nearest are one set
            tied = ~clear
        assert tied[differ].all(), f"{anchor.name}: rows {differ[~tied[differ]][:5]} differ without a tie"
        assert np.allclose(conf[clear, anchor.index], sk.predict_proba(x).max(axis=1)[clear], atol=1e-6)
        if ties == "nearer":
            by_rule = np.array([nearer_voters(ref_labels[index[i]], distance[i], k) for i in range(n)])
            assert (mine[clear] == by_rule[clear]).all(), anchor.name
        ties, differ_total = ties + int(tied.sum()), differ_total + len(differ)
        mask = read_probe_arrays(probed, "synthetic", rid.split("/")[-1] + "@clean", anchor.name)["reference"][0]
        assert mask.shape == (N_REF,) and mask.all()  # over the reference store's rows
    print(f"k={k} {metric}: {differ_total} of {n * len(DIMS)} predictions differ from scikit-learn's, "
          f"all among {ties} tied rows")


def test_the_default_still_votes_with_the_probe_train_split(stores, tmp_path):
    """Without refs the references are the probed store's rows; the run id spells the metric and tie rule."""
    _, ref, probed = stores
    probe(probed, tmp_path / "f.duckdb", "knn")
    mask = read_probe_arrays(probed, "synthetic", "knn:metric=euclidean,ties=lowest@clean", "anchor00")["reference"][0]
    assert mask.shape == (FeatureStore(probed).num_images,) and 0 < mask.sum() < len(mask)


@pytest.mark.parametrize("what", ["weights", "anchors", "classes"])
def test_a_reference_store_of_another_model_is_refused(stores, tmp_path, what):
    root, _, probed = stores
    feats, labels = class_clusters(100, 5 if what != "classes" else 6, DIMS if what != "anchors" else [16, 24, 32],
                                   seed=4)
    other = write_feature_store(tmp_path / "other.zarr", feats, labels, 5 if what != "classes" else 6,
                                weights_id="other-weights" if what == "weights" else "synthetic")
    db = tmp_path / "f.duckdb"
    line = fails("probe", "--store", probed, "--model", "synthetic", "--db", db, "--variant", f"knn:refs={other}")
    assert f"knn:refs={other}" in line
    assert {"weights": "weights other-weights where the probed store holds synthetic",
            "anchors": "anchor02:32 where the probed store holds anchor00:16",
            "classes": "class names"}[what] in line, line
    assert not db.exists()
    fs = FeatureStore(probed)
    names = fs.listed("synthetic/probes") if "probes" in fs.listed("synthetic") else []
    assert f"knn:refs={location_digest(str(other))}@clean" not in names


def test_a_missing_reference_store_is_one_line(stores, tmp_path):
    _, _, probed = stores
    line = fails("probe", "--store", probed, "--model", "synthetic", "--db", tmp_path / "f.duckdb", "--variant",
                 f"knn:refs={tmp_path / 'nowhere.zarr'}")
    assert "no featstore store" in line and not (tmp_path / "f.duckdb").exists()
