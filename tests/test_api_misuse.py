"""The Python API and the probe job misused as a careful but hostile user would: each of these 11 cases
failed on main before the change, silently or with a traceback from inside numpy, torch or Zarr:

1. kNN references that share images with the probed set (the probed store itself, a `--limit` subset of the same
   folder, the same files copied elsewhere: same content checksum) or that were made with other preprocessing
   (`--image-size`) are refused in one line, exit 2, nothing written;
2. `fs.probe(cfg, variant=..., name=...)` and `fs.build(cfg, store=...)` refuse a config mixed with fields;
3. features with NaN or infinity are refused before `fs.Probe` fits, naming how many rows and where;
4. an estimator probe is identified by the sha256 of its full settings, not scikit-learn's elided repr: PCA(1)
   and PCA(8) pipelines are two runs (the second is fitted under `keep_landed`), with two default names;
5. an estimator whose `classes_` are no class indices of the store ([10, 20, 30, 40] on 4 classes) is refused;
6. `split(val_frac=2.0)`, `val_frac=-1`, negative or fractional `split_seed` are refused naming the field, and a
   label far past the classes (2,000,000 among 200 rows) builds no 2,000,001-way softmax (array or store);
7. a run the API replaced is a warning naming it and is in the result's `replaced`;
8. one FeatstoreError, before any fit where it can be, for: `fit` on 0 rows, `predict` before `fit`, `predict` at
   the wrong width, `LoadedProbe.predict(fold=3)`, an estimator class, a one-column `predict_proba`, an
   unpicklable estimator, a 300-character name;
9. probe names are checked at registration ('', 'a/b', 'x:y', '../../escape'), and an entry point that raises or
   calls sys.exit is a warning naming it while `featstore probe` runs the variant under its entry point's name;
10. Ctrl-C (SIGINT, sent again and again) during the probe's database write leaves the database as it was or
    complete, never partial, with one line and exit status 2, never a traceback;
11. docs/python.md and docs/clusters.md say what is safe to load from whom.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import duckdb
import numpy as np
import pytest
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.decomposition import PCA
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from synthetic import class_clusters, make_image_folder, write_feature_store

import featstore as fs
from featstore.errors import FeatstoreError, FeatstoreWarning

from conftest import Running, digest, fails, run_cli

ROOT = Path(__file__).resolve().parents[1]
DIMS = [8, 12]
FITS: list[str] = []  # what the test estimators below were fitted as (class names), to show nothing was fitted


class Counting(BaseEstimator, ClassifierMixin):
    """Nearest class mean; every fit is counted in FITS."""

    def __init__(self, hook=None):
        self.hook = hook

    def fit(self, X, y):
        FITS.append(type(self).__name__)
        self.classes_ = np.unique(y)
        self.means_ = np.stack([X[y == c].mean(axis=0) for c in self.classes_])
        return self

    def predict_proba(self, X):
        d = -((X[:, None, :] - self.means_[None]) ** 2).sum(axis=2)
        e = np.exp(d - d.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)


class ShiftedClasses(Counting):
    """Learns labels 10, 20, 30, 40 for the store's 0..3: predictions of classes the store does not have."""

    def fit(self, X, y):
        super().fit(X, y)
        self.classes_ = (self.classes_ + 1) * 10
        return self


class OneColumn(Counting):
    """predict_proba with one column whatever its classes_."""

    def predict_proba(self, X):
        return np.ones((len(X), 1))


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """A 4-class synthetic store of 200 rows, 2 anchors."""
    root = tmp_path_factory.mktemp("misuse")
    feats, labels = class_clusters(200, 4, DIMS, seed=5)
    return write_feature_store(root / "s.zarr", feats, labels, 4)


OPTIONS = fs.RunOptions(threads=1, progress=False)


def _probe(store: Path, db: Path, variant, **fields):
    return fs.probe(store=store, model="synthetic", db=db, variant=variant, run=OPTIONS, **fields)


def _probes_group(store: Path) -> list[str]:
    folder = Path(store) / "synthetic" / "probes"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.exists() else []


# -- 1. kNN references ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image_stores(tmp_path_factory) -> dict[str, Path]:
    """Real image stores (random-init resnet18 at 32 px) of one folder, a --limit subset of it, the same files
    copied to another folder, other images, and other images at another --image-size."""
    root = tmp_path_factory.mktemp("knn_images")
    images = make_image_folder(root / "a", n_classes=3, per_class=5, size=(40, 40), seed=1)
    other = make_image_folder(root / "b", n_classes=3, per_class=5, size=(40, 40), seed=2)
    copied = shutil.copytree(images, root / "copied")

    def build(data: Path, store: str, *extra: str) -> Path:
        run_cli("build", "--model", "resnet18", "--weights", "none", "--data", data, "--store", root / store,
                "--no-progress", "--threads", "1", *extra)
        return root / store

    return {"probed": build(images, "probed.zarr", "--image-size", "32"),
            "subset": build(images, "subset.zarr", "--image-size", "32", "--limit", "6"),
            "copied": build(copied, "copied.zarr", "--image-size", "32"),
            "other": build(other, "other.zarr", "--image-size", "32"),
            "other-size": build(other, "other48.zarr", "--image-size", "48")}


def _knn(stores: dict[str, Path], refs: Path, db: Path):
    return ("probe", "--store", stores["probed"], "--model", "resnet18", "--db", db, "--variant",
            f"knn:refs={refs},k=3", "--no-progress", "--threads", "1")


@pytest.mark.parametrize("which, said", [("probed", "it is the probed store itself"),
                                         ("subset", "6 of its 6 images are files of the probed set"),
                                         ("copied", "15 of its 15 images have the content of an image of the "
                                                    "probed set")])
def test_knn_references_that_share_images_with_the_probed_set_are_refused(image_stores, tmp_path, which, said):
    db = tmp_path / "f.duckdb"
    line = fails(*_knn(image_stores, image_stores[which], db))
    assert f"knn:refs={image_stores[which]}" in line and said in line and "vote for themselves" in line, line
    assert not db.exists()
    assert not any(n.startswith("knn") for n in _probes_group(image_stores["probed"]))


def test_knn_references_of_other_preprocessing_are_refused(image_stores, tmp_path):
    """Other images at the same size are accepted; the same other images at --image-size 48 are not."""
    ok = tmp_path / "ok.duckdb"
    run_cli(*_knn(image_stores, image_stores["other"], ok))
    assert ok.exists()
    db = tmp_path / "f.duckdb"
    line = fails(*_knn(image_stores, image_stores["other-size"], db))
    assert "crop 48 where the probed store has 32" in line and "resize 55 where the probed store has 37" in line
    assert not db.exists()


# -- 2. a config and fields ---------------------------------------------------------------------------------------


def test_a_config_and_fields_in_one_call_are_refused(small, tmp_path):
    from featstore.workflows.build import BuildConfig

    cfg = fs.ProbeConfig(store=small, model="synthetic", db=tmp_path / "f.duckdb", run=OPTIONS)
    with pytest.raises(FeatstoreError, match=r"probe: give a ProbeConfig or its fields, not both .*variant=, name="):
        fs.probe(cfg, variant="knn", name="mine")
    with pytest.raises(FeatstoreError, match=r"probe: .*memory_budget= would be dropped"):
        fs.probe(cfg, memory_budget="1MB")
    assert not (tmp_path / "f.duckdb").exists()
    build_cfg = BuildConfig(model=fs.ModelSpec("resnet18", weights="none", image_size=32),
                            images=fs.ImageSource(tmp_path / "nowhere"), store=tmp_path / "a.zarr")
    with pytest.raises(FeatstoreError, match=r"build: give a BuildConfig or its fields, not both .*store="):
        fs.build(build_cfg, store=tmp_path / "b.zarr")
    assert not (tmp_path / "a.zarr").exists() and not (tmp_path / "b.zarr").exists()


# -- 3. non-finite features ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features_are_refused_before_fitting(bad):
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(80, 5)).astype(np.float32), np.arange(80) % 4
    X[[3, 17, 40], 2] = bad
    probe = fs.Probe("linear")
    with pytest.raises(FeatstoreError, match=r"X: 3 of 80 rows hold NaN or infinity \(the first, row 3, in column "
                                             r"2: .*nothing was fitted"):
        probe.fit(X, y)
    assert not hasattr(probe, "fitted_")


# -- 4. estimator identity ----------------------------------------------------------------------------------------


def _pipeline(components: int) -> Pipeline:
    """Long enough that scikit-learn's repr elides its middle, where the PCA is."""
    before = [(f"scale{i}", StandardScaler()) for i in range(12)]
    after = [(f"rescale{i}", StandardScaler()) for i in range(12)]
    return Pipeline([*before, ("pca", PCA(components)), *after, ("lr", LogisticRegression(max_iter=200))])


def test_an_estimator_is_identified_by_its_full_settings(small, tmp_path):
    from featstore.probing.estimator_variant import default_name, estimator_digest

    one, eight = _pipeline(1), _pipeline(8)
    assert repr(one) == repr(eight)  # what identified them before: the elided repr
    assert estimator_digest(one) != estimator_digest(eight)
    assert estimator_digest(one) == estimator_digest(_pipeline(1))  # stable: equal settings, equal digest
    names = default_name(one), default_name(eight)
    assert names[0] != names[1] and all(n.startswith("pipeline-") for n in names), names
    db = tmp_path / "f.duckdb"
    run = "synthetic/clean/pipe"
    query = "SELECT pred FROM predictions WHERE run_id = ? ORDER BY image_id, anchor"
    _probe(small, db, one, name="pipe", keep_landed=True)
    first = duckdb.connect(str(db), read_only=True).execute(query, [run]).fetchnumpy()["pred"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FeatstoreWarning)
        result = _probe(small, db, eight, name="pipe", keep_landed=True)
    con = duckdb.connect(str(db), read_only=True)
    second = con.execute(query, [run]).fetchnumpy()["pred"]
    params = json.loads(con.execute("SELECT params FROM runs WHERE run_id = ?", [run]).fetchone()[0])
    con.close()
    assert not (first == second).all(), "the PCA(8) pipeline was taken for the PCA(1) one and never fitted"
    assert params["estimator_sha256"] == estimator_digest(eight)
    assert list(result) == [run] and not result.kept


# -- 5. classes_ ------------------------------------------------------------------------------------------------


def test_an_estimators_classes_must_be_the_stores(small, tmp_path):
    db = tmp_path / "f.duckdb"
    FITS.clear()
    with pytest.raises(FeatstoreError, match=r"the fitted ShiftedClasses of anchor 0: classes_ \[10, 20, 30, 40\] "
                                             r"are not class indices of the store's 4 classes \(0\.\.3\)"):
        _probe(small, db, ShiftedClasses(), name="shifted")
    assert FITS == ["ShiftedClasses"]  # refused after the first anchor's fit, not after all
    assert not db.exists() and not any(n.startswith("shifted") for n in _probes_group(small))


# -- 6. ranges ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, said", [({"val_frac": 2.0}, "val_frac=2.0: must be a number > 0 and < 1"),
                                          ({"val_frac": -1}, "val_frac=-1: must be a number > 0 and < 1"),
                                          ({"split_seed": -1}, "split_seed=-1: must be a whole number >= 0"),
                                          ({"split_seed": 1.5}, "split_seed=1.5: must be a whole number >= 0")])
def test_split_settings_out_of_range_are_refused(small, kwargs, said):
    model = fs.open_store(small).model("synthetic")
    with pytest.raises(FeatstoreError) as caught:
        model.split(**kwargs)
    assert str(caught.value) == said
    with pytest.raises(FeatstoreError, match=said.replace("(", r"\(")):
        fs.Probe("linear", **kwargs).fit(np.ones((40, 3), dtype=np.float32), np.arange(40) % 2)


def test_a_label_far_past_the_classes_builds_no_huge_softmax(tmp_path):
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(200, 6)).astype(np.float32), np.arange(200) % 4
    y[7] = 2_000_000
    probe = fs.Probe("linear").fit(X, y)  # classes_ are np.unique(y): 2,000,000 is a fifth class, not an index
    assert probe.classes_.tolist() == [0, 1, 2, 3, 2_000_000] and probe.predict_proba(X).shape == (200, 5)
    with pytest.raises(FeatstoreError, match=r"y: label 2000000 is no class index of classes=4"):
        fs.Probe("linear", classes=4).fit(X, y)
    assert fs.Probe("linear", classes=6).fit(X, np.arange(200) % 4).predict_proba(X).shape == (200, 6)
    # a store whose image table holds such a label
    feats, labels = class_clusters(200, 4, DIMS, seed=6)
    store = write_feature_store(tmp_path / "s.zarr", feats, labels, 4)
    _crafted_label(store, 7, 2_000_000)
    db = tmp_path / "f.duckdb"
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", db, "--threads", "1", "--no-progress")
    assert "label 2000000 of its image table is no class index of its 4 classes (0..3)" in line, line
    assert not db.exists()


def _crafted_label(store: Path, row: int, label: int) -> None:
    """Rewrite one label of a store's image table as a crafted store would hold it (its checksums and fingerprint
    made anew, so nothing reads as damage)."""
    from featstore.images.datasets import ImageSet
    from featstore.store.writer import StoreWriter

    writer = StoreWriter(store)
    table, attrs = writer.image_table(), writer.image_attrs()
    labels = np.asarray(table["label"]).copy()
    labels[row] = label
    writer.write_images(ImageSet(Path(attrs["root"]), table["image_id"], list(table["path"]), labels,
                                 attrs["class_names"], attrs["source"]))


# -- 7. replaced runs -----------------------------------------------------------------------------------------------


def test_the_api_says_when_it_replaced_a_run(small, tmp_path):
    db = tmp_path / "f.duckdb"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FeatstoreWarning)  # nothing replaced: no word
        first = _probe(small, db, LinearDiscriminantAnalysis())
        other = _probe(small, db, LinearDiscriminantAnalysis(solver="lsqr"))
    assert first.replaced == () and other.replaced == ()
    assert first.runs != other.runs  # two estimators of one class: two default names, two runs
    with pytest.warns(FeatstoreWarning, match=f"replaced run {first.runs[0]}"):
        again = _probe(small, db, LinearDiscriminantAnalysis())
    assert again.replaced == first.runs and list(again) == list(first.runs)
    (run,) = again  # still unpacks as the list of run ids it was
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
    con.close()


# -- 8. one clean error -------------------------------------------------------------------------------------------


def test_misused_array_probes_are_one_clean_error():
    rng = np.random.default_rng(2)
    X, y = rng.normal(size=(60, 5)).astype(np.float32), np.arange(60) % 3
    with pytest.raises(FeatstoreError, match=r"X of shape \(0, 5\): fit needs rows"):
        fs.Probe().fit(np.zeros((0, 5), dtype=np.float32), np.zeros(0, dtype=np.int64))
    with pytest.raises(FeatstoreError, match="not fitted yet: call fit"):
        fs.Probe().predict(X)
    probe = fs.Probe().fit(X, y)
    with pytest.raises(FeatstoreError, match=r"X of shape \(60, 4\): the probe was fitted on 5 features per row"):
        probe.predict(X[:, :4])
    with pytest.raises(FeatstoreError, match=r"X of shape \(60, 7\): the probe was fitted on 5 features"):
        probe.predict_proba(np.ones((60, 7), dtype=np.float32))


def test_a_loaded_probe_refuses_a_fold_it_does_not_have(small, tmp_path):
    db = tmp_path / "f.duckdb"
    (run,) = _probe(small, db, "linear")
    loaded = fs.load_probe(small, "synthetic", run, db=db)
    X = fs.open_store(small).model("synthetic").features("anchor00")
    assert loaded.predict("anchor00", X).shape == (200,)
    with pytest.raises(FeatstoreError, match=r"fold=3: linear@clean holds 1 fit\(s\) per anchor \(folds 0\.\.0"):
        loaded.predict("anchor00", X, fold=3)
    with pytest.raises(FeatstoreError, match=r"X of shape \(200, 12\): the probe was fitted on 8 features"):
        loaded.predict("anchor00", fs.open_store(small).model("synthetic").features("anchor01"))


@pytest.mark.parametrize("case", ["class", "one-column", "unpicklable", "long-name"])
def test_misused_estimators_are_refused_before_anything_is_written(small, tmp_path, case):
    db = tmp_path / "f.duckdb"
    variant, name, said = {
        "class": (Counting, "c", r"variant='Counting': give an instance \(Counting\(\)\), not the class"),
        "one-column": (OneColumn(), "c", r"the fitted OneColumn of anchor 0: predict_proba gives shape \(2, 1\)"),
        "unpicklable": (Counting(hook=lambda x: x), "c", r"variant='Counting\(\.\.\.\)': does not pickle .*nothing was "
                                                         r"fitted"),
        "long-name": (Counting(), "a" * 300, r"name='a{60}…' \(300 characters\): use letters a-z"),
    }[case]
    FITS.clear()
    with pytest.raises(FeatstoreError, match=said):
        _probe(small, db, variant, name=name)
    assert FITS == (["OneColumn"] if case == "one-column" else [])  # nothing fitted but the one that shows it
    assert not db.exists() and not any(n.startswith(("c@", "aaa")) for n in _probes_group(small))


# -- 9. names and entry points ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "a/b", "x:y", "../../escape", "Upper", "a" * 65])
def test_probe_names_are_checked_at_registration(name):
    from featstore.probing import VARIANTS, ProbeVariant

    before = dict(VARIANTS)
    cls = type("Bad", (ProbeVariant,), {"name": name, "make": lambda self, ctx: None,
                                        "plan": lambda self, n: None})
    with pytest.raises(FeatstoreError, match=r"Bad\.name=.*use letters a-z, digits, _ \. -"):
        fs.register_probe(cls)
    assert VARIANTS == before


PLUGINS = {
    "exit_plugin.py": "import sys\nsys.exit(3)\n",
    "raise_plugin.py": "raise RuntimeError('broken plug-in')\n",
    "near_plugin.py": '''
import torch

from featstore.probing import AnchorProbe, LinearFit, ProbeVariant
from featstore.probing.base import Plan


class Means(AnchorProbe):
    def __init__(self, ctx):
        self.sums = torch.zeros(ctx.num_classes, ctx.dim, dtype=torch.float64)
        self.counts = torch.zeros(ctx.num_classes, dtype=torch.float64)

    def step(self, x, y, is_val, report=False):
        self.sums.index_add_(0, y, x.double())
        self.counts.index_add_(0, y, torch.ones(len(y), dtype=torch.float64))

    def fitted(self, val_x, val_y):
        mu = self.sums / self.counts.clamp_min(1)[:, None]
        return LinearFit(weight=(2 * mu).float(), bias=-(mu * mu).sum(dim=1).float(), epochs=1)


class NearestMean(ProbeVariant):
    name = "nearest-mean-by-its-class"

    def plan(self, n_fit):
        return Plan(max_epochs=1, batch_size=256)

    def make(self, ctx):
        return Means(ctx)
''',
}


def test_entry_points_that_raise_or_exit_are_warnings_and_their_name_is_the_variant(small, tmp_path):
    site = tmp_path / "site"
    info = site / "misuse_plugins-0.1.dist-info"
    info.mkdir(parents=True)
    for file, text in PLUGINS.items():
        (site / file).write_text(text)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: misuse-plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[featstore.probes]\nexiter = exit_plugin:Gone\n"
                                           "raiser = raise_plugin:Gone\nnear = near_plugin:NearestMean\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    db = tmp_path / "f.duckdb"
    done = subprocess.run([sys.executable, "-m", "featstore.cli.main", "probe", "--store", str(small), "--model",
                           "synthetic", "--db", str(db), "--variant", "near", "--threads", "1", "--no-progress"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if line.startswith("featstore: warning:")]
    assert any("'exiter' (exit_plugin:Gone)" in w and "exited (3)" in w for w in warned), done.stderr
    assert any("'raiser' (raise_plugin:Gone)" in w and "RuntimeError: broken plug-in" in w for w in warned)
    assert "Traceback" not in done.stderr
    assert "wrote run synthetic/clean/near" in done.stdout


# -- 10. Ctrl-C during the write ----------------------------------------------------------------------------------


def _versions(store: Path) -> set[str]:
    folder = store / "synthetic" / "probes" / "linear@clean"
    return {p.name for p in folder.iterdir() if p.is_dir()} if folder.exists() else set()


def _state(db: Path) -> tuple[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        (version,) = con.execute("SELECT probe_version FROM runs WHERE run_id = 'synthetic/clean/linear'").fetchone()
        (n,) = con.execute("SELECT count(*) FROM predictions WHERE run_id = 'synthetic/clean/linear'").fetchone()
    finally:
        con.close()
    return version, n


def test_ctrl_c_during_the_database_write_rolls_it_back(tmp_path, forked_cli):
    """SIGINT sent the moment the job starts its write (its new weights version appears in the store) and after
    delays that move it through the write and past it, one run per moment: each time the database is the old one,
    every row, with one line and exit status 2, or the complete new run (the job finished its write first; a
    Ctrl-C that lands after it, while the CLI prints, is one line and exit status 130), never a traceback.

    Five moments, each a class of where the signal lands: twice at once (the write's start: the moment that must
    roll back, tried twice so that one late wake-up of this process cannot lose it), 10 ms and 50 ms in (inside the
    transaction, its rows going in) and 0.6 s (past the commit: the finished run, or 130 while the CLI prints). Each
    moment is one process (forked from one that has imported featstore and torch: conftest's ForkedCLI), so more
    delays between these add time, not a new case."""
    feats, labels = class_clusters(3000, 4, [16, 16, 16], seed=7)
    store = write_feature_store(tmp_path / "s.zarr", feats, labels, 4)
    db = tmp_path / "f.duckdb"
    args = ["probe", "--store", str(store), "--model", "synthetic", "--db", str(db), "--variant", "linear",
            "--threads", "1", "--no-progress"]
    run_cli(*args)  # the old run, in this process: only the interrupted ones need a process of their own
    outcomes = []
    for delay in (0.0, 0.0, 0.01, 0.05, 0.6):
        old, old_state, old_versions = digest(db), _state(db), _versions(store)

        def interrupt(pid: int, delay: float = delay, old_versions: set[str] = old_versions) -> None:
            deadline = time.monotonic() + 120  # a hang guard only
            while Running(pid).poll() is None and not (_versions(store) - old_versions) and time.monotonic() < deadline:
                time.sleep(0.0005)
            time.sleep(delay)
            Running(pid).send_signal(signal.SIGINT)  # unless it ended first

        status, _, err = forked_cli.run_apart(args, started=interrupt)
        returncode = os.waitstatus_to_exitcode(status)
        assert "Traceback" not in err, err
        lines = [line for line in err.splitlines() if line.strip()]
        if digest(db) == old:
            assert returncode == 2 and len(lines) == 1, (returncode, err)
            assert lines[0].startswith("featstore: error: interrupted while writing the runs into"), lines
            assert "rolled back" in lines[0] and _state(db) == old_state
            outcomes.append("rolled back")
        else:
            version, n = _state(db)
            assert version not in old_versions and n == 3000 * 3, (version, n)
            # after the write: 'featstore: interrupted' (130), or Python's own exit by SIGINT (-2)
            assert returncode in (0, 130, -signal.SIGINT), (returncode, err)
            outcomes.append("finished" if returncode == 0 else "interrupted after the write")
    print(outcomes)
    assert "rolled back" in outcomes


# -- 11. docs -----------------------------------------------------------------------------------------------------


def test_the_docs_say_what_is_safe_to_load_from_whom():
    python, clusters = (ROOT / "docs" / "python.md").read_text(), (ROOT / "docs" / "clusters.md").read_text()
    assert "## Safe to load from whom" in clusters, "docs/clusters.md"
    for text in (python, clusters):
        assert "trust_pickle=True" in text and "knn:refs=" in text
    assert "ProbeResult" in python and "replaced" in python
    assert "[a-z0-9][a-z0-9_.-]" in python  # the probe name rule, as registration checks it
