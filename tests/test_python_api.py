"""The public Python API (docs/python.md): its example runs as written, and its numbers are checked here against
what the store and the database hold (read with zarr and SQL directly) and against scikit-learn and numpy."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

ROOT = Path(__file__).resolve().parents[1]


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "python.md").read_text(), flags=re.S)


@pytest.fixture(scope="module")
def doc(tmp_path_factory) -> dict:
    """docs/python.md's code blocks, executed in order in a fresh folder (one namespace, as a notebook)."""
    where = tmp_path_factory.mktemp("python_doc")
    here = os.getcwd()
    os.chdir(where)
    namespace: dict = {"__name__": "python_doc"}
    try:
        for i, block in enumerate(_blocks()):
            exec(compile(block, f"docs/python.md block {i}", "exec"), namespace)
    finally:
        os.chdir(here)
    namespace["where"] = where
    return namespace


def _sql(doc: dict, query: str, params=None):
    return doc["results"].sql(query, params)


def test_import_is_light_until_a_function_needs_more():
    code = ("import sys, featstore as fs\nheavy = lambda: sorted(m for m in ('torch', 'duckdb', 'polars') "
            "if m in sys.modules)\nprint(heavy())\nfs.open_store, fs.connect, fs.Probe, fs.build\nprint(heavy())\n"
            "fs.Probe('linear')\nprint(heavy())\nprint(callable(fs.build), sorted(fs.__all__) == sorted(dir(fs)) or "
            "set(fs.__all__) <= set(dir(fs)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:3] == ["[]", "[]", "[]"], out  # a Probe's __init__ only stores its parameters: fit imports torch
    assert out[3] == "True True", out


def test_the_doc_has_every_step_the_issue_names():
    text = "\n".join(_blocks())
    for needed in ("fs.build(", "fs.open_store(", "fs.Probe(", "fs.probe(", "decision_layers(2)", "fs.load_probe("):
        assert needed in text, needed


def test_the_doc_shows_every_command_in_python_and_only_fs():
    """Each command of the CLI has its row in the doc's table; no example shells out to `featstore` or imports
    featstore's modules beneath the API; every `fs.NAME` an example uses exists, and the examples the test does not
    run compile."""
    import ast

    import featstore as fs
    from featstore.cli.main import cli

    page = (ROOT / "docs" / "python.md").read_text()
    rows = set(re.findall(r"^\| `featstore ([a-z-]+)` \| `fs\.", page, flags=re.M))
    assert rows == set(cli.commands), sorted(set(cli.commands) ^ rows)
    unrun = re.findall(r"```python notrun\n(.*?)```", page, flags=re.S)
    assert unrun
    for block in [*_blocks(), *unrun]:
        tree = ast.parse(block)
        assert "subprocess" not in block and "featstore.cli" not in block
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {m for m in imported if m and m.startswith("featstore.")}, imported
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "fs"}
        assert used <= set(fs.__all__), used - set(fs.__all__)


def test_every_command_s_python_form_returns_what_the_database_holds(doc):
    """The doc's calls of the query commands and jobs, checked against SQL on the database, the Parquet files and
    the store read directly."""
    import polars as pl

    results, linear, lda = doc["results"], doc["linear_run"], doc["lda_run"]
    assert doc["checked"].sound and doc["checked"].unreferenced == []
    assert [line.split()[1] for line in __import__("featstore").anchors("resnet18")] == \
        [a.name for a in doc["model"].anchors]
    sweep = _sql(doc, "SELECT * FROM decision_sweep(4) WHERE run_id = ? ORDER BY k", [linear])
    assert doc["sweep"].table["mean"].to_list() == pytest.approx(sweep["mean"].to_list())
    assert doc["sweep"].table["k"].to_list() == [1, 2, 3, 4] and "model" not in doc["sweep"].shown.columns
    image = doc["image"]
    assert image.k == 2 and image.table["run_id"].unique().sort().to_list() == sorted([linear, lda])
    layer = _sql(doc, "SELECT layer FROM decision_layers(2) WHERE run_id = ? AND image_id = ?",
                 [linear, int(doc["layers"]["image_id"][0])])["layer"][0]
    marked = image.table.filter((pl.col("run_id") == linear) & pl.col("decided"))["anchor"].to_list()
    assert marked == [layer]
    assert sorted(doc["compared"].runs) == sorted([linear, lda])
    assert doc["first"].columns == _sql(doc, "SELECT * FROM predictions LIMIT 0").columns
    tested = _sql(doc, "SELECT count(*) AS n FROM images WHERE split = 'test'")["n"][0]
    assert doc["exits"].run_id == linear and f"population: {tested} images" in doc["exits"].population
    costs = _sql(doc, "SELECT count(*) AS n FROM anchor_costs")["n"][0]
    assert costs == len(doc["model"].anchors)
    exported = pl.read_parquet(doc["where"] / "digits" / "parquet" / "runs.parquet")
    assert sorted(exported["run_id"].to_list()) == sorted(results.runs["run_id"].to_list())
    assert doc["merged"].runs == len(results.runs)
    x, y = (doc["model"].features(a).astype(np.float64) for a in (0, 1))  # linear CKA, biased HSIC, by hand
    x, y = x - x.mean(0), y - y.mean(0)
    by_hand = np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))
    stored = _sql(doc, "SELECT cka FROM anchor_cka WHERE anchor_a = 0 AND anchor_b = 1")["cka"][0]
    assert stored == pytest.approx(by_hand, rel=1e-4)
    assert _sql(doc, "SELECT count(*) AS n FROM anchor_cka")["n"][0] == len(doc["model"].anchors) ** 2


def test_the_store_handle_reads_what_zarr_holds(doc):
    import featstore as fs

    model, path = doc["model"], doc["where"] / "digits" / "s.zarr"
    raw = zarr.open_group(str(path), mode="r")
    assert doc["store"].models == ["resnet18"] and model.views == ["clean"]
    names = [a.name for a in model.anchors]
    assert len(names) == 12 and names[4] == "layer2.0"
    stored = raw["resnet18"]["clean"]["anchors"]["layer2.0"][:]
    assert stored.dtype == np.float16 and doc["X"].dtype == np.float32
    np.testing.assert_array_equal(doc["X"], stored.astype(np.float32))
    np.testing.assert_array_equal(model.features(4), doc["X"])
    np.testing.assert_array_equal(model.labels, raw["images"]["label"][:])
    np.testing.assert_array_equal(model.image_ids, raw["images"]["image_id"][:])
    assert np.bincount(model.labels).tolist() == np.bincount(__import__("sklearn.datasets").datasets.load_digits()
                                                             .target).tolist()
    for bad in ("layer2.O", 12, -1, 6.5, True, None):
        with pytest.raises(fs.FeatstoreError, match=r"layer1\.0, layer1\.1, layer2\.0") as e:
            model.features(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(fs.FeatstoreError, match="no view 'fog-1'"):
        model.features(0, view="fog-1")
    with pytest.raises(fs.FeatstoreError, match="has no model 'vit'"):
        doc["store"].model("vit")


def test_probe_on_arrays_predicts_the_cli_run(doc):
    """The doc asserts it on every image; here also the split it used is make_split's, independently counted, and
    the probabilities are the softmax the run's confidences are the maximum of."""
    model, probe, X = doc["model"], doc["probe"], doc["X"]
    split = doc["split"]
    n = len(split)
    assert (split == "test").sum() == n - round(0.7 * n) and (split == "val").sum() == round(0.1 * round(0.7 * n))
    db = _sql(doc, "SELECT pred, conf FROM predictions WHERE run_id = 'resnet18/clean/linear' AND anchor = 4 "
                   "ORDER BY image_id")
    pred = probe.predict(X)
    np.testing.assert_array_equal(pred, db["pred"].to_numpy())
    proba = probe.predict_proba(X)
    assert proba.shape == (n, 10)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(proba.argmax(axis=1), pred)
    # the run solved 12 anchors in one batched L-BFGS, this one anchor alone: both stop within gtol of the same
    # optimum, so the classes agree everywhere and the confidences to about 1e-3 (0.005 at most measured)
    np.testing.assert_allclose(proba.max(axis=1), db["conf"].to_numpy(), atol=2e-2)
    assert np.median(np.abs(proba.max(axis=1) - db["conf"].to_numpy())) < 1e-4
    assert (pred[split == "test"] == model.labels[split == "test"]).mean() > 0.5


def test_probe_is_a_scikit_learn_estimator(doc):
    from sklearn.base import clone

    import featstore as fs

    probe = fs.Probe("linear", C=1.0, seed=3)
    params = probe.get_params()
    assert params["variant"] == "linear" and params["C"] == 1.0 and params["seed"] == 3
    copy = clone(probe)
    assert copy.get_params() == params and copy is not probe
    assert probe.set_params(C=2.0).get_params()["C"] == 2.0
    with pytest.raises(fs.FeatstoreError, match="no parameter 'Cee'"):  # checked by fit: __init__ only stores
        fs.Probe("linear", Cee=1).fit(doc["X"][:40], doc["model"].labels[:40])
    with pytest.raises(fs.FeatstoreError, match="unknown probe variant 'lin'"):
        fs.Probe("lin").fit(doc["X"][:40], doc["model"].labels[:40])
    # pinned C on arrays vs scikit-learn's LogisticRegression at the same objective (standardised features)
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    X, y = doc["X"][:600], doc["model"].labels[:600]
    is_val = np.zeros(len(y), dtype=bool)
    is_val[::10] = True
    ours = fs.Probe("linear", C=0.5).fit(X, y, is_val=is_val).predict(doc["X"][600:])
    scaler = StandardScaler().fit(X.astype(np.float64))
    lr = LogisticRegression(C=0.5, tol=1e-8, max_iter=5000).fit(scaler.transform(X.astype(np.float64)), y)
    theirs = lr.predict(scaler.transform(doc["X"][600:].astype(np.float64)))
    assert (ours == theirs).mean() >= 0.995


def _decision_layer(preds: np.ndarray, k: int) -> tuple[int, bool]:
    """l*(k) by hand (docs/design.md §7): the first l with k+1 equal predictions from l; else T, never stable."""
    t = len(preds) - 1
    for layer in range(t - k + 1):
        if all(preds[layer + j] == preds[layer] for j in range(1, k + 1)):
            return layer, False
    return t, True


def test_an_estimator_run_lands_where_every_macro_reads_it(doc):
    """decision_layers(2) of the LDA run equals l*(2) computed in numpy from scikit-learn LDAs fitted here on the
    train rows (split as the database holds it, features as zarr holds them)."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    model, lda_run = doc["model"], doc["lda_run"]
    assert lda_run == "resnet18/clean/lda"
    runs = doc["results"].runs
    assert set(runs["run_id"]) == {"resnet18/clean/linear", "resnet18/clean/lda"}
    assert runs.filter(runs["run_id"] == lda_run)["probe"][0] == "lda"
    images = _sql(doc, "SELECT image_id, split FROM images ORDER BY image_id")
    split = images["split"].to_numpy()
    raw = zarr.open_group(str(doc["where"] / "digits" / "s.zarr"), mode="r")["resnet18"]["clean"]["anchors"]
    train = split == "train"
    preds = np.stack([LinearDiscriminantAnalysis().fit(raw[a.name][:][train].astype(np.float32),
                                                       model.labels[train]).predict(raw[a.name][:].astype(np.float32))
                      for a in model.anchors], axis=1)
    test = np.flatnonzero(split == "test")
    ids = images["image_id"].to_numpy()
    expected = [(int(ids[i]), *_decision_layer(preds[i], 2)) for i in test]
    layers = doc["layers"]
    got = list(zip(layers["image_id"].to_list(), layers["layer"].to_list(), layers["never_stable"].to_list(),
                   strict=True))
    assert len(got) == len(expected) == 1797 - round(0.7 * 1797)
    assert got == expected
    fits = _sql(doc, "SELECT anchor, val_accuracy FROM probe_fits WHERE run_id = ? ORDER BY anchor", [lda_run])
    assert len(fits) == 12 and fits["val_accuracy"].max() > 0.5


@pytest.mark.parametrize("run", ["resnet18/clean/linear", "resnet18/clean/lda"])
def test_loaded_probes_predict_the_stored_predictions(doc, run):
    import featstore as fs

    path, db = doc["where"] / "digits" / "s.zarr", doc["where"] / "digits" / "results.duckdb"
    model = doc["model"]
    trust = run.endswith("/lda")  # an estimator's pickle is read only when asked for (docs/python.md)
    for loaded in (fs.load_probe(path, "resnet18", run, db=db, trust_pickle=trust),
                   fs.load_probe(path, "resnet18", run, trust_pickle=trust)):
        for a in model.anchors:
            stored = _sql(doc, "SELECT pred, conf FROM predictions WHERE run_id = ? AND anchor = ? ORDER BY image_id",
                          [run, a.index])
            X = model.features(a.name)
            np.testing.assert_array_equal(loaded.predict(a.name, X), stored["pred"].to_numpy())
            np.testing.assert_allclose(loaded.confidence(a.index, X), stored["conf"].to_numpy(), atol=1e-6)
    with pytest.raises(fs.FeatstoreError, match="has no run"):
        fs.load_probe(path, "resnet18", "resnet18/clean/knn", db=db)


def test_estimators_and_names_are_checked_before_anything_is_written(doc, tmp_path):
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    import featstore as fs

    store, db = doc["where"] / "digits" / "s.zarr", tmp_path / "r.duckdb"
    for variant, name, match in ((object(), None, "predict_proba"), (LinearDiscriminantAnalysis(), "linear",
                                                                     "is a registered probe variant"),
                                 (LinearDiscriminantAnalysis(), "a/b", "use letters")):
        with pytest.raises(fs.FeatstoreError, match=match):
            fs.probe(store=store, model="resnet18", db=db, variant=variant, name=name)
    with pytest.raises(fs.FeatstoreError, match="cross_fit"):
        fs.probe(store=store, model="resnet18", db=db, variant=LinearDiscriminantAnalysis(), cross_fit=2)
    assert not db.exists()
    from featstore.probing import VARIANTS

    assert "lineardiscriminantanalysis" not in VARIANTS and "lda" not in VARIANTS


PLUGIN = '''
"""A tiny installed probe variant: nearest class mean on the raw features."""
import torch

from featstore.probing import AnchorProbe, LinearFit, ProbeVariant
from featstore.probing.base import Plan


class Means(AnchorProbe):
    def __init__(self, ctx):
        self.sums = torch.zeros(ctx.num_classes, ctx.dim, dtype=torch.float64)
        self.counts = torch.zeros(ctx.num_classes, dtype=torch.float64)

    def step(self, x, y, is_val, report=False):
        keep = ~is_val
        self.sums.index_add_(0, y[keep], x[keep].double())
        self.counts.index_add_(0, y[keep], torch.ones(int(keep.sum()), dtype=torch.float64))

    def fitted(self, val_x, val_y):
        mu = self.sums / self.counts.clamp_min(1)[:, None]
        return LinearFit(weight=(2 * mu).float(), bias=-(mu * mu).sum(dim=1).float(), epochs=1)


class NearestMean(ProbeVariant):
    name = "nearest"

    def plan(self, n_fit):
        return Plan(max_epochs=1, batch_size=256)

    def make(self, ctx):
        return Means(ctx)
'''


def test_an_installed_package_adds_a_variant_the_cli_finds(doc, tmp_path):
    """A real entry point: a module and its dist-info on the subprocess's PYTHONPATH, found by importlib.metadata."""
    site = tmp_path / "site"
    (site / "nearest_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "nearest_plugin.py").write_text(PLUGIN)
    (site / "nearest_plugin-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nearest-plugin\nVersion: 0.1\n")
    (site / "nearest_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[featstore.probes]\nnearest = nearest_plugin:NearestMean\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    store, db = doc["where"] / "digits" / "s.zarr", tmp_path / "r.duckdb"
    done = subprocess.run([sys.executable, "-m", "featstore.cli.main", "probe", "--store", str(store), "--model",
                           "resnet18", "--db", str(db), "--variant", "nearest", "--threads", "1", "--no-progress"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "wrote run resnet18/clean/nearest" in done.stdout
    import featstore as fs

    results = fs.connect(db)
    split = results.sql("SELECT split FROM images ORDER BY image_id")["split"].to_numpy()
    model = doc["model"]
    for a in model.anchors[::4]:
        X = model.features(a.name).astype(np.float64)
        train = split == "train"
        means = np.stack([X[train & (model.labels == c)].mean(axis=0) for c in range(10)])
        expected = ((X[:, None, :] - means[None]) ** 2).sum(axis=2).argmin(axis=1)
        stored = results.sql("SELECT pred FROM predictions WHERE run_id = 'resnet18/clean/nearest' AND anchor = ? "
                             "ORDER BY image_id", [a.index])["pred"].to_numpy()
        assert (stored == expected).mean() >= 0.995, a.name
    # without the package on the path the name is unknown, one line
    gone = subprocess.run([sys.executable, "-m", "featstore.cli.main", "probe", "--store", str(store), "--model",
                           "resnet18", "--db", str(tmp_path / "x.duckdb"), "--variant", "nearest"],
                          capture_output=True, text=True)
    assert gone.returncode == 2 and "unknown probe variant 'nearest'" in gone.stderr


def test_register_probe_from_user_code():
    import featstore as fs
    from featstore.probing import VARIANTS, get_variant
    from featstore.probing.linear import Linear

    @fs.register_probe
    class Strong(Linear):
        name = "strong_linear_test"

    try:
        assert isinstance(get_variant("strong_linear_test:C=0.01"), Strong)
        with pytest.raises(ValueError, match="already registered"):
            fs.register_probe(type("Strong", (Linear,), {"name": "strong_linear_test"}))
        with pytest.raises(TypeError, match="ProbeVariant subclass"):
            fs.register_probe(object)
    finally:
        VARIANTS.pop("strong_linear_test", None)


def test_results_are_read_only_and_one_line_when_missing(doc, tmp_path):
    import featstore as fs

    with pytest.raises(fs.FeatstoreError, match="no database there"):
        fs.connect(tmp_path / "none.duckdb")
    with pytest.raises(fs.FeatstoreError, match="read-only"):
        doc["results"].sql("DELETE FROM runs")
    line = doc["results"].timeline("resnet18/clean/linear", 0)
    direct = _sql(doc, "SELECT anchor, pred FROM predictions WHERE run_id = 'resnet18/clean/linear' AND image_id = 0 "
                       "ORDER BY anchor")
    assert line["pred"].to_list() == direct["pred"].to_list() and len(line) == 12
    with pytest.raises(fs.FeatstoreError, match="no predictions of image 99999"):
        doc["results"].timeline("resnet18/clean/linear", 99999)



