"""Stores and databases from someone else: nothing in them runs, nothing they name leaks, nothing waits.

Each case is an attack a careful but hostile sender can make with a crafted store or database, played for real:

1. a linear run whose weight group holds a pickle instead (`estimator`): `load_probe` loads by the variant the run
   records, with `db=` and without, and never unpickles it, not even with `trust_pickle=True`;
2. a database whose run points `params.probe_name` (or `probe_version`) at another group: refused in one line;
3. an estimator probe: stored as bytes (uint8), unpickled only with `trust_pickle=True`, and only when its bytes
   are those whose sha256 the database recorded with the run (a swapped pickle is refused; an old float32 copy of
   the same bytes still loads);
4. a `meta` table replaced by a VIEW over `read_text('secret.txt')`: `featstore sql --db a --db crafted` refuses it
   in one line and never prints the file;
5. the same database given to `featstore export`: refused, nothing written;
6. a macro named like a DuckDB built-in (`count_star`, what `count(*)` calls) that reads a file, in a database a
   write job opens (`featstore merge --db crafted`): refused before it runs;
7. every connection featstore opens (write, read-only, several databases as one) is sealed: no file access, no
   extension install or load, configuration locked;
8. the report reads images only under the database's recorded image root: an absolute `images.path`, a `../`
   path and a symlink out of the root are skipped;
9. a FIFO as an image: `featstore report` skips it and finishes (a hang guard, no timing), while an image under
   the root is still shown.

Future surfaces that read a store or a database extend this module with their own attacks.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
import zarr
from PIL import Image
from synthetic import class_clusters, register_toy_images, run_rows, write_feature_store

from featstore.analytics import db as fsdb
from featstore.analytics.queries import decision_examples
from featstore.errors import FeatstoreError

from conftest import fails

LINEAR_RUN, LINEAR_NAME = "synthetic/clean/linear:tol=0.02", "linear:tol=0.02@clean"
LDA_RUN, LDA_NAME = "synthetic/clean/lda", "lda@clean"
ANCHORS = ("anchor00", "anchor01")


class _Payload:
    """Unpickling this writes `marker`: what a crafted pickle would do with the reader's rights."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def payload(marker: Path) -> np.ndarray:
    return np.frombuffer(pickle.dumps(_Payload(marker)), dtype=np.uint8)


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> Path:
    """A small store with a linear run and an estimator (LDA) run, both in one database."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    import featstore as fs

    root = tmp_path_factory.mktemp("hostile")
    feats, labels = class_clusters(90, 3, [4, 6], seed=2)
    store = write_feature_store(root / "s.zarr", feats, labels, 3, chunk_rows=32)
    options = fs.RunOptions(threads=1, progress=False)
    fs.probe(store=store, model="synthetic", db=root / "f.duckdb", variant="linear:tol=0.02", run=options)
    fs.probe(store=store, model="synthetic", db=root / "f.duckdb", variant=LinearDiscriminantAnalysis(), name="lda",
             run=options)
    return root


@pytest.fixture
def copied(probed, tmp_path) -> tuple[Path, Path]:
    """A copy of the probed store and database that a test may damage."""
    shutil.copytree(probed, tmp_path / "w")
    return tmp_path / "w" / "s.zarr", tmp_path / "w" / "f.duckdb"


def probe_group(store: Path, name: str) -> zarr.Group:
    return zarr.open_group(str(store), mode="a")["synthetic"]["probes"][name]


def plant(group: zarr.Group, arrays: dict[str, np.ndarray], drop: tuple[str, ...] = ()) -> None:
    """Put `arrays` (folds first) into every anchor's group under `group`, removing the arrays named in `drop`."""
    for anchor in ANCHORS:
        g = group.require_group(anchor)
        for name in drop:
            if name in g:
                del g[name]
        for name, values in arrays.items():
            g.create_array(name, shape=values.shape, dtype=values.dtype, overwrite=True)[:] = values


def test_a_linear_run_never_unpickles_what_its_weight_group_holds(copied, tmp_path):
    """Case 1: the store decided the kind (an `estimator` array where weights belong was unpickled)."""
    import featstore as fs

    store, db = copied
    marker = tmp_path / "ran"
    group = probe_group(store, LINEAR_NAME)
    plant(group[group.attrs["current"]], {"estimator": payload(marker)[None]}, drop=("weight", "bias"))
    for kwargs in ({"db": db}, {}, {"db": db, "trust_pickle": True}, {"trust_pickle": True}):
        with pytest.raises(FeatstoreError, match="records variant linear") as e:
            fs.load_probe(store, "synthetic", LINEAR_RUN, **kwargs)
        assert "\n" not in str(e.value)
    assert not marker.exists()


def test_a_database_cannot_point_a_run_at_another_group(copied, tmp_path):
    """Case 2: `params.probe_name` of a crafted runs row chose the group that was read (and unpickled)."""
    import featstore as fs

    store, db = copied
    marker = tmp_path / "ran"
    plant(zarr.open_group(str(store), mode="a")["synthetic"]["probes"].require_group("evil"),
          {"estimator": payload(marker)[None]})
    con = duckdb.connect(str(db))
    con.execute("UPDATE runs SET params = json_merge_patch(params, '{\"probe_name\": \"evil\", \"probe_version\": "
                "null}'), probe_name = 'evil', probe_version = NULL WHERE run_id = ?", [LINEAR_RUN])
    con.close()
    for kwargs in ({}, {"trust_pickle": True}):
        with pytest.raises(FeatstoreError, match=f"names probes 'evil' where run {LINEAR_RUN!r} names "
                                                 f"'{LINEAR_NAME}'"):
            fs.load_probe(store, "synthetic", LINEAR_RUN, db=db, **kwargs)
    assert not marker.exists()
    con = duckdb.connect(str(db))
    con.execute("UPDATE runs SET params = json_merge_patch(params, ?), probe_name = ?, probe_version = '../lda@clean' "
                "WHERE run_id = ?", [json.dumps({"probe_name": LINEAR_NAME, "probe_version": "../lda@clean"}),
                                     LINEAR_NAME, LINEAR_RUN])
    con.close()
    with pytest.raises(FeatstoreError, match="'../lda@clean' is no stored-weights version"):
        fs.load_probe(store, "synthetic", LINEAR_RUN, db=db)


def test_an_estimator_is_unpickled_only_when_trusted_and_as_the_database_recorded(copied, tmp_path):
    """Case 3: pickles were kept as float32 and unpickled by any load_probe, whatever bytes the store held."""
    import featstore as fs

    store, db = copied
    group = probe_group(store, LDA_NAME)
    held = group[group.attrs["current"]]
    assert held["anchor00"]["estimator"].dtype == np.uint8
    for kwargs in ({"db": db}, {}):
        with pytest.raises(FeatstoreError, match="trust_pickle=True"):
            fs.load_probe(store, "synthetic", LDA_RUN, **kwargs)
    stored = duckdb.connect(str(db), read_only=True).execute(
        "SELECT anchor, pred FROM predictions WHERE run_id = ? ORDER BY image_id, anchor", [LDA_RUN]).fetchall()
    model = fs.open_store(store).model("synthetic")

    def predictions(loaded) -> list:
        preds = np.stack([loaded.predict(a, model.features(a)) for a in ANCHORS], axis=1)
        return [(a, int(p)) for row in preds for a, p in enumerate(row)]

    assert predictions(fs.load_probe(store, "synthetic", LDA_RUN, db=db, trust_pickle=True)) == stored
    for a in ANCHORS:  # a store written before bytes stayed bytes: float32 values of the same bytes
        old = held[a]["estimator"][:].astype(np.float32)
        held[a].create_array("estimator", shape=old.shape, dtype=old.dtype, overwrite=True)[:] = old
    assert predictions(fs.load_probe(store, "synthetic", LDA_RUN, db=db, trust_pickle=True)) == stored
    marker = tmp_path / "ran"
    plant(held, {"estimator": payload(marker)[None]})
    with pytest.raises(FeatstoreError, match="sha256 .* differs from the one database .* recorded"):
        fs.load_probe(store, "synthetic", LDA_RUN, db=db, trust_pickle=True)
    assert not marker.exists()


# -- crafted databases ------------------------------------------------------------------------------------------


@pytest.fixture
def toy(tmp_path) -> Path:
    """A featstore database of 8 images with one run: what the crafted databases are copies of."""
    db = tmp_path / "a.duckdb"
    con = fsdb.connect(db)
    register_toy_images(con, np.arange(8) % 2, np.array(["test"] * 8), ("m",), 3)
    fsdb.write_runs(con, [run_rows({"run_id": "m/clean/linear", "model": "m", "view": "clean"}, np.arange(8),
                                   np.zeros((8, 3), int), np.ones((8, 3)))])
    con.close()
    return db


def crafted(db: Path, to: Path, *statements: str) -> Path:
    """A copy of `db` changed by `statements` (run by a plain DuckDB client, as a sender would)."""
    shutil.copyfile(db, to)
    con = duckdb.connect(str(to))
    for statement in statements:
        con.execute(statement)
    con.close()
    return to


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_text("TOPSECRET-4f1c9a")
    return path


def meta_view(secret: Path) -> tuple[str, str]:
    return ("DROP TABLE meta", f"CREATE VIEW meta AS SELECT 'dataset' AS key, content AS value "
                               f"FROM read_text('{secret}')")


def test_sql_over_several_databases_never_reads_a_crafted_view(toy, secret, tmp_path):
    """Case 4: the identity check of `sql --db a --db b` ran before sealing and printed the file in its error."""
    bad = crafted(toy, tmp_path / "crafted.duckdb", *meta_view(secret))
    for dbs in (["--db", toy, "--db", bad], ["--db", bad]):
        line = fails("sql", *dbs, "SELECT 1")
        assert "meta is a view where featstore keeps a table" in line
        assert "TOPSECRET" not in line


def test_export_of_a_crafted_database_writes_nothing(toy, secret, tmp_path):
    """Case 5: export opened the database unsealed and wrote the file into meta.parquet."""
    bad = crafted(toy, tmp_path / "crafted.duckdb", *meta_view(secret))
    line = fails("export", "--db", bad, "--to", tmp_path / "out")
    assert "meta is a view where featstore keeps a table" in line and "TOPSECRET" not in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_a_macro_named_like_a_builtin_is_refused_before_it_runs(toy, secret, tmp_path):
    """Case 6: a persisted `count_star` replaces count(*) in every query of the database; merge's write connection
    ran it with file access, and the file came out in the error (a cast of its text to a number)."""
    bad = crafted(toy, tmp_path / "crafted.duckdb",
                  f"CREATE MACRO count_star() AS (SELECT content::INTEGER FROM read_text('{secret}'))")
    source = crafted(toy, tmp_path / "b.duckdb")
    for args in (("merge", "--db", bad, source), ("sql", "--db", bad, "SELECT count(*) FROM runs")):
        line = fails(*args)
        assert "defines count_star, a function DuckDB already has" in line and "TOPSECRET" not in line


def test_every_connection_featstore_opens_is_sealed(toy, tmp_path):
    """Case 7: write connections (probe, merge, gate, cost, ...) kept file access and extension autoload on."""
    sealed = (False, False, False, True)
    settings = ("SELECT current_setting('enable_external_access'), current_setting('autoinstall_known_extensions'), "
                "current_setting('autoload_known_extensions'), current_setting('lock_configuration')")
    other = crafted(toy, tmp_path / "b.duckdb", *[f"DELETE FROM {table}" for table in fsdb.RUN_TABLES])
    for open_ in (lambda: fsdb.connect(tmp_path / "new.duckdb"), lambda: fsdb.connect(toy),
                  lambda: fsdb.connect(toy, read_only=True), lambda: fsdb.connect_several([toy, other])):
        con = open_()
        try:
            assert con.execute(settings).fetchone() == sealed
        finally:
            con.close()


# -- the report's images ----------------------------------------------------------------------------------------


def test_report_reads_images_only_under_the_recorded_root(tmp_path):
    """Case 8: an absolute path (or ../, or a symlink) in images.path embedded any local image in the report."""
    from featstore.analytics.report import _thumbnail

    root, outside = tmp_path / "images", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    Image.new("RGB", (4, 4), (200, 10, 10)).save(root / "in.png")
    Image.new("RGB", (4, 4), (10, 200, 10)).save(outside / "private.png")
    (root / "link.png").symlink_to(outside / "private.png")
    assert _thumbnail(root, "in.png") is not None
    for path in (str(outside / "private.png"), "../outside/private.png", "link.png"):
        assert _thumbnail(root, path) is None, path
    assert _thumbnail(None, str(outside / "private.png")) is None  # no recorded root: no image at all


def test_report_skips_a_fifo_and_finishes(tmp_path):
    """Case 9: a FIFO named as an image made `featstore report` wait forever on its open."""
    root = tmp_path / "images"
    root.mkdir()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(root / "in.png")
    os.mkfifo(root / "pipe.png")
    Image.new("RGB", (8, 8), (10, 200, 10)).save(tmp_path / "private.png")
    kinds = ["in.png", "pipe.png", str(tmp_path / "private.png"), "../private.png"]
    n, t, classes = 40, 4, 2
    labels = np.arange(n) % classes
    preds = np.array([[label if a >= i % (t + 1) else 1 - label for a in range(t + 1)] for i, label in
                      enumerate(labels)])
    db = tmp_path / "r.duckdb"
    con = fsdb.connect(db)
    register_toy_images(con, labels, np.array(["test"] * n), ("m",), t + 1)
    fsdb.write_runs(con, [run_rows({"run_id": "m/clean/linear", "model": "m", "view": "clean",
                                    "params": {"probe_name": "linear@clean"}}, np.arange(n), preds,
                                   np.full(preds.shape, 0.9))])
    shown = decision_examples(con)["image_id"].to_list()  # the images the report draws: one of each kind
    assert len(shown) >= len(kinds)
    con.execute("UPDATE images SET path = 'pipe.png'")
    con.executemany("UPDATE images SET path = ? WHERE image_id = ?", list(zip(kinds, shown, strict=False)))
    con.close()
    fsdb.record_image_source(db, root, ["a", "b"])
    try:  # a hang guard, not a speed check: the report takes a few seconds
        done = subprocess.run([sys.executable, "-m", "featstore.cli.main", "report", "--db", str(db), "--out",
                               str(tmp_path / "rep")], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:  # (run() killed it)
        pytest.fail("featstore report waited on a FIFO")
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "rep" / "report.html").read_text()
    assert all(f"<small>({kind}, test)</small>" in page for kind in kinds)  # every kind had its timeline
    assert "<img class='thumb' alt='in.png'" in page
    for skipped in kinds[1:]:
        assert f"<img class='thumb' alt='{skipped}'" not in page
