"""Python arguments as a careful but hostile user passes them, and the attacks not reached before. Each of these
11 cases failed on main before the change, but case 10, which held there (its test keeps it);
case 8's S3 verbs held too, but for a single database path given to `verify` and `gc` (case 6):

1. `fs.connect("r.duckdb")`, then `os.chdir(other)`, then `.report()` wrote `other/report/` and returned a
   relative path: the report goes beside the database, the path returned is absolute;
2. numpy integers as k (`k_sweep(ks=np.array([1, 2]))`, `compare(k=np.int64(2))`, `spread`, `report(ks=...)`,
   `early_exit(ks=[np.int64(2)])`) failed inside DuckDB or were "no integers": they are the ks they hold;
3. an image id read from `model.image_ids` (a numpy integer) failed in `image_timeline`: it is that image;
4. a single k (`k_sweep(ks=3)`, `spread(ks=3)`, `early_exit(run, ks=3)`, and `cost(batch_sizes=1)`) was a bare
   TypeError: it is the list of that one;
5. bare TypeError/IndexError/AttributeError/RuntimeError from `k_sweep(min_conf='0.5')`, `k_sweep(runs=123)`,
   `k_sweep(ks=2.5)`, `fs.connect([])`, `fs.anchors(None)`, `open_store(None)`, `sql(None)`, `timeline(run, 'x')`,
   `fs.gate(None)`, `fs.cka(db=None)`, `fs.Probe(threads=-1).fit`: one FeatstoreError naming the field (also a
   TypeError where the kind was wrong);
6. a string where a list of databases belongs was read letter by letter (`fs.merge(db, "r.duckdb")`,
   `verify(dbs="r.duckdb")`, `fs.gc(store, dbs="r.duckdb")`): one path is one database;
7. `model.features(0, view=None)` and `model.stored_probe('../..')` said the sound store was damaged, and
   `probe_summary('a/b/c')` returned an empty table: each names the argument;
8. a store on the S3 test server through the `fs` verbs: info, verify, features, probe, load_probe, gc;
9. a store whose noise view records view generator 1 (made before generator 2) is read by every verb and resumed
   by the build; a view generator that is no whole number (`'two'`, `1.5`) was a traceback or read as generator
   1: refused in one line;
10. calibration bins on a one-class set: every image in the top bin, accuracy 1, ECE 0, as `featstore sql` prints;
11. `cost`/`cka`/`gate` with odd inputs (a run that does not exist, one anchor, one class, a store without the
    model, an empty or missing database), through `fs.*` and the CLI: a refused `cost` left a new database
    behind; now each is right or one line, nothing written.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
import zarr
from polars.testing import assert_frame_equal
from synthetic import class_clusters, make_image_folder, write_feature_store

import featstore as fs
from featstore.analytics import db as fsdb

from conftest import copy_db, fails, run_cli

RUN = "resnet18/clean/linear"
QUIET = fs.RunOptions(threads=1, progress=False)


def refused(call, *said: str, kind: type = ValueError) -> str:
    """`call` raises one FeatstoreError of one line holding every `said`, and an instance of `kind`."""
    with pytest.raises(fs.FeatstoreError) as caught:
        call()
    text = str(caught.value)
    assert isinstance(caught.value, kind) and "\n" not in text, text
    assert all(s in text for s in said), text
    assert "damaged" not in text, text
    return text


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Path, list[np.ndarray], np.ndarray]:
    """A three-anchor store of 60 class clusters (no network): the store, its features and labels."""
    feats, labels = class_clusters(60, 3, [4, 6, 8], seed=0)
    return write_feature_store(tmp_path_factory.mktemp("syn") / "s.zarr", feats, labels, 3), feats, labels


def test_1_the_report_goes_beside_the_database_whatever_the_working_folder(digits_linear, tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    copy_db(digits_linear[0], tmp_path / "a" / "r.duckdb")
    monkeypatch.chdir(tmp_path / "a")
    results = fs.connect("r.duckdb")
    monkeypatch.chdir(tmp_path / "b")
    page = results.report()
    assert page == tmp_path / "a" / "report" / "report.html" and page.is_absolute() and page.is_file()
    assert not (tmp_path / "b" / "report").exists()
    assert results.sql("SELECT count(*) AS n FROM runs")["n"][0] == 1  # the handle still reads a/r.duckdb


def test_2_numpy_integers_are_the_windows_they_hold(digits_linear, tmp_path):
    results = fs.connect(digits_linear[0])
    assert_frame_equal(results.k_sweep(ks=np.array([1, 2])).table, results.k_sweep(ks=[1, 2]).table)
    sweep = results.k_sweep(ks=np.array([1, 2])).table
    assert sorted(sweep["k"].to_list()) == [1, 2]
    # l*(2) by hand from the stored predictions of the test images: the first anchor l <= T - 2 whose prediction
    # holds at l + 1 and l + 2 (never: T, the last anchor's index; docs/design.md §7)
    preds = results.sql("SELECT list(pred ORDER BY anchor) AS p FROM predictions JOIN images USING (image_id) "
                        "WHERE run_id = ? AND split = 'test' GROUP BY image_id", [RUN])["p"].to_list()
    t = len(preds[0]) - 1
    stable = [next((a for a in range(t - 1) if len(set(p[a:a + 3])) == 1), t) for p in preds]
    row = sweep.filter(pl.col("k") == 2)
    assert row["n"][0] == len(preds) and row["mean"][0] == pytest.approx(np.mean(stable))
    want = results.compare(k=2)
    got = results.compare(k=np.int64(2))
    assert_frame_equal(got.summary, want.summary)
    assert_frame_equal(results.spread(ks=np.array([2])).table, results.spread(ks=[2]).table)
    page = results.report(tmp_path / "r", ks=np.array([2]))
    assert page.is_file()


def test_3_an_image_id_read_from_the_store_is_that_image(digits_store, digits_linear):
    results = fs.connect(digits_linear[0])
    ids = fs.open_store(digits_store).model("resnet18").image_ids
    test = results.sql("SELECT min(image_id) AS i FROM images WHERE split = 'test'")["i"][0]
    image = ids[int(np.flatnonzero(ids == test)[0])]
    assert isinstance(image, np.integer)
    shown = results.image_timeline(image)
    want = duckdb.connect(str(digits_linear[0]), read_only=True).execute(
        "SELECT pred FROM predictions WHERE run_id = ? AND image_id = ? ORDER BY anchor", [RUN, test]).fetchall()
    assert shown.image_id == test and shown.table.sort("anchor")["pred"].to_list() == [p for (p,) in want]
    assert results.timeline(RUN, image)["pred"].to_list() == [p for (p,) in want]


def test_4_a_single_k_is_the_list_of_that_one(digits_store, digits_linear, tmp_path):
    results = fs.connect(digits_linear[0])
    assert_frame_equal(results.k_sweep(ks=3).table, results.k_sweep(ks=[3]).table)
    assert_frame_equal(results.spread(ks=3).table, results.spread(ks=[3]).table)
    db = copy_db(digits_linear[0], tmp_path / "c.duckdb")
    (cost,) = fs.cost("resnet18", db, digits_store, device="cpu", batch_sizes=1, repeats=np.int64(1))
    assert cost.batch_size == 1 and len(cost.anchors) == 12
    timed = fs.connect(db)
    one = timed.early_exit(RUN, ks=3, thresholds=0.9, combined_thresholds=np.float32(0.5))
    listed = timed.early_exit(RUN, ks=[3], thresholds=[0.9], combined_thresholds=[0.5])
    assert_frame_equal(one.simulation, listed.simulation)
    numpy = timed.early_exit(RUN, ks=[np.int64(2)], thresholds=np.array([0.9]))
    assert_frame_equal(numpy.simulation, timed.early_exit(RUN, ks=[2], thresholds=[0.9]).simulation)


@pytest.mark.parametrize(("call", "said", "kind"), [
    (lambda r, db, store: r.k_sweep(min_conf="0.5"), "min_conf='0.5'", TypeError),
    (lambda r, db, store: r.k_sweep(runs=123), "runs=123", TypeError),
    (lambda r, db, store: r.k_sweep(ks=2.5), "k=2.5", TypeError),
    (lambda r, db, store: fs.connect([]), "db=[]", ValueError),
    (lambda r, db, store: fs.anchors(None), "model=None", TypeError),
    (lambda r, db, store: fs.open_store(None), "location=None", TypeError),
    (lambda r, db, store: r.sql(None), "query=None", TypeError),
    (lambda r, db, store: r.timeline(RUN, "x"), "image_id='x'", TypeError),
    (lambda r, db, store: fs.gate(None), "db=None", TypeError),
    (lambda r, db, store: fs.cka(store, "synthetic", None), "db=None", TypeError),
    (lambda r, db, store: fs.cost(None, db, store), "model=None", TypeError),
    (lambda r, db, store: fs.Probe("linear", threads=-1).fit(np.eye(6), np.arange(6) % 2), "threads=-1", ValueError),
], ids=["min_conf", "runs", "ks", "connect", "anchors", "open_store", "sql", "timeline", "gate", "cka", "cost",
        "threads"])
def test_5_a_wrong_argument_is_one_line_naming_it(synthetic, tmp_path, call, said, kind):
    store = synthetic[0]
    db = tmp_path / "f.duckdb"
    fs.probe(store=store, model="synthetic", db=db, run=QUIET)
    before = sorted(p.name for p in tmp_path.iterdir())
    refused(lambda: call(fs.connect(db), db, store), said, kind=kind)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def unname_the_version_of(db: str | Path, store: str | Path) -> None:
    """Leave the probe version `db` names in `store` named by no run and not current (another database's probe
    made current, then `db`'s runs deleted): what gc may remove once every database in reach is read."""
    fs.probe(store=store, model="synthetic", db=Path(db).with_name("other.duckdb"), run=QUIET)
    with duckdb.connect(str(db)) as con:
        for table in ("predictions", "probe_fits", "runs"):
            con.execute(f"DELETE FROM {table}")


def test_6_one_path_is_one_database(synthetic, tmp_path, monkeypatch):
    store = shutil.copytree(synthetic[0], tmp_path / "s.zarr")
    monkeypatch.chdir(tmp_path)
    fs.probe(store=store, model="synthetic", db="r.duckdb", run=QUIET)
    merged = fs.merge("m.duckdb", "r.duckdb")
    assert merged.runs == 1 and fs.connect("m.duckdb").runs["run_id"].to_list() == ["synthetic/clean/linear"]
    unname_the_version_of("r.duckdb", store)
    one, listed = (fs.open_store(store).verify(dbs=d) for d in ("r.duckdb", ["r.duckdb"]))
    assert one.problems == listed.problems == [] and len(one.unreferenced) == len(listed.unreferenced) == 1
    judged = fs.gc(store, dbs="r.duckdb", min_age=0, dry_run=True)
    assert [(u.version, u.removable) for u in judged] == [(listed.unreferenced[0].version, True)]


def test_7_an_argument_of_no_view_probe_or_run_is_named_not_called_damage(synthetic, tmp_path):
    store = synthetic[0]
    model = fs.open_store(store).model("synthetic")
    refused(lambda: model.features(0, view=None), "view=None", "clean", kind=TypeError)
    refused(lambda: model.features(0, view="../.."), "'../..'", "clean")
    refused(lambda: model.stored_probe("../.."), "'../..'")
    refused(lambda: model.stored_probe(None), "name=None", kind=TypeError)
    db = tmp_path / "f.duckdb"
    fs.probe(store=store, model="synthetic", db=db, run=QUIET)
    refused(lambda: fs.connect(db).probe_summary("a/b/c"), "'a/b/c'")
    summary = fs.connect(db).probe_summary("synthetic/clean/linear")
    assert len(summary) == 3
    assert fs.open_store(store).verify().sound


def test_8_a_store_on_s3_through_the_fs_verbs(s3_url, tmp_path):
    import obstore
    from test_object_store import objects

    feats, labels = class_clusters(60, 3, [4, 6, 8], seed=1)
    url = write_feature_store(s3_url + "/s.zarr", feats, labels, 3, chunk_rows=16)
    store = fs.open_store(url)
    info = store.info().to_dict()
    assert info["path"] == url and info["images"]["count"] == 60
    assert info["models"]["synthetic"]["views"]["clean"]["chunks_done"] == 4  # 60 rows in chunks of 16
    assert store.verify().sound
    model = store.model("synthetic")
    for i, f in enumerate(feats):
        assert np.array_equal(model.features(i), f.astype(np.float32))
    assert np.array_equal(model.labels, labels)
    db = tmp_path / "f.duckdb"
    fs.probe(store=url, model="synthetic", db=db, run=QUIET)
    first = fs.open_store(url).model("synthetic").stored_probe("linear@clean").version
    loaded = fs.load_probe(url, "synthetic", "synthetic/clean/linear", db=db)
    stored = fs.connect(db).sql("SELECT image_id, anchor, pred FROM predictions ORDER BY image_id, anchor")
    again = np.stack([loaded.predict(i, model.features(i)) for i in range(3)], axis=1)
    assert (again.ravel() == stored["pred"].to_numpy()).all()
    unname_the_version_of(db, url)
    (unnamed,) = fs.open_store(url).verify(dbs=db).unreferenced
    assert unnamed.version.version == first and unnamed.removable is False  # younger than an hour
    prefix = "synthetic/probes/linear@clean/"
    listed = {m["path"].removeprefix(prefix).split("/")[0]
              for batch in obstore.list(objects(url), prefix) for m in batch}
    assert first in listed
    (removed,) = fs.gc(url, dbs=str(db), min_age=0)
    assert removed.removable and removed.version.version == first
    left = {m["path"].removeprefix(prefix).split("/")[0] for batch in obstore.list(objects(url), prefix) for m in batch}
    assert first not in left and len(left - {"zarr.json"}) == 1
    assert fs.open_store(url).verify(dbs=db).unreferenced == []
    refused(lambda: fs.open_store("s3:/featstore-test/x"), "s3://BUCKET/PREFIX")


SMALL = ["--model", "resnet18", "--weights", "none", "--image-size", "32", "--chunk-rows", "4", "--batch-size", "2",
         "--no-progress", "--threads", "1", "--workers", "0"]


def test_9_a_view_of_generator_one_is_read_and_resumed(tmp_path):
    jpegs = make_image_folder(tmp_path / "j", n_classes=3, per_class=4, size=(60, 45))
    made = tmp_path / "made.zarr"
    build = ["--data", jpegs, "--views", "clean,gaussian_noise-1", *SMALL]
    run_cli("build", "--store", made, *build)
    noisy = [fs.open_store(made).model("resnet18").features(a, view="gaussian_noise-1") for a in (0, 11)]
    for recorded in (None, "two", 1.5):
        store = shutil.copytree(made, tmp_path / f"g{recorded}.zarr")
        group = zarr.open_group(str(store), mode="a")["resnet18"]["gaussian_noise-1"]
        attrs = dict(group.attrs)
        if recorded is None:
            del attrs["view_generator"]  # as featstore wrote views before generator 2
        else:
            attrs["view_generator"] = recorded
        group.attrs.put(attrs)
        if recorded is not None:
            line = fails("build", "--store", store, *build)
            assert f"view generator {recorded!r}, which this featstore does not have" in line
            continue
        old = fs.open_store(store)
        views = old.info().to_dict()["models"]["resnet18"]["views"]
        assert old.verify().sound and views["gaussian_noise-1"]["chunks_done"] == 3
        assert all(np.array_equal(old.model("resnet18").features(a, view="gaussian_noise-1"), x)
                   for a, x in zip((0, 11), noisy, strict=True))
        db = tmp_path / "g.duckdb"
        (run,) = fs.probe(store=store, model="resnet18", db=db, view="gaussian_noise-1", run=QUIET)
        assert run == "resnet18/gaussian_noise-1/linear/train=clean" and len(fs.connect(db).probe_summary(run)) == 12
        assert "0 chunk(s) written, 3 already done" in run_cli("build", "--store", store, *build).output


def test_10_calibration_bins_of_a_one_class_set(tmp_path):
    feats, _ = class_clusters(60, 3, [4, 6], seed=0)
    store = write_feature_store(tmp_path / "one.zarr", feats, np.zeros(60, dtype=np.int64), 1)
    db = tmp_path / "f.duckdb"
    (run,) = fs.probe(store=store, model="synthetic", db=db, run=QUIET)
    bins = fs.connect(db).sql("SELECT * FROM calibration_bins(?)", [run])
    conf = fs.connect(db).sql("SELECT anchor, conf, pred FROM predictions p JOIN images USING (image_id) "
                              "WHERE run_id = ? AND split = 'test' ORDER BY anchor", [run])
    assert (conf["pred"] == 0).all()
    for anchor, rows in conf.group_by("anchor", maintain_order=True):
        want = sorted({max(1, min(15, math.ceil(c * 15))) for c in rows["conf"]})
        got = bins.filter(pl.col("anchor") == anchor[0])
        assert got["bin"].to_list() == want == [15]  # a softmax of one class is sure of it
        assert got["n"].to_list() == [len(rows)] and got["accuracy"].to_list() == [1.0]
    printed = run_cli("sql", "--db", db, f"SELECT anchor, ece, accuracy FROM calibration('{run}')").output
    assert printed.count("0.0000") == 2 and printed.count("1.0000") == 2


def test_11_cost_cka_and_gate_with_odd_inputs(tmp_path):
    feats, labels = class_clusters(60, 3, [4, 6, 8], seed=0)
    store = write_feature_store(tmp_path / "s.zarr", feats, labels, 3)
    one_anchor = write_feature_store(tmp_path / "one.zarr", feats[:1], labels, 3)
    one_class = write_feature_store(tmp_path / "oc.zarr", feats, np.zeros(60, dtype=np.int64), 1)
    db = tmp_path / "f.duckdb"
    fs.probe(store=store, model="synthetic", db=db, run=QUIET)
    empty = tmp_path / "empty.duckdb"
    fsdb.connect(empty).close()  # a featstore database no job has filled yet
    missing = tmp_path / "missing.duckdb"
    # a run that does not exist, a database without runs, a missing database: one line, in Python and the CLI
    refused(lambda: fs.gate(db, "x/y/z"), "'x/y/z'")
    assert "'x/y/z'" in fails("gate", "--db", db, "--run", "x/y/z")
    refused(lambda: fs.gate(empty), "holds no probe run")
    assert "holds no probe run" in fails("gate", "--db", empty)
    refused(lambda: fs.gate(missing), f"db={missing}: no database there")
    # a store without the model
    refused(lambda: fs.cka(store, "nope", tmp_path / "c.duckdb"), "no model 'nope'")
    assert "no model 'nope'" in fails("cka", "--store", store, "--model", "nope", "--db", tmp_path / "c.duckdb")
    refused(lambda: fs.cost("nope", tmp_path / "k.duckdb", store), "no model 'nope'")
    assert "no model 'nope'" in fails("cost", "--model", "nope", "--db", tmp_path / "k.duckdb", "--store", store)
    # cost without a store reads the database's anchors; none (an empty or a missing database) is one line
    for where in (empty, missing):
        refused(lambda w=where: fs.cost("resnet18", w, device="cpu"), "has no anchors of 'resnet18'")
        assert "has no anchors" in fails("cost", "--model", "resnet18", "--db", where, "--device", "cpu")
    assert not missing.exists() and not (tmp_path / "k.duckdb").exists() and not (tmp_path / "c.duckdb").exists()
    # one anchor: CKA of an anchor with itself is 1; a gate over one anchor sees only its confidence
    cka = fs.cka(one_anchor, "synthetic", tmp_path / "one.duckdb")
    assert cka.anchors == ["anchor00"] and cka.matrix.tolist() == [[1.0]]
    fs.probe(store=one_anchor, model="synthetic", db=tmp_path / "one.duckdb", run=QUIET)
    gate = fs.gate(tmp_path / "one.duckdb")
    assert gate.n_rows == gate.n_images and gate.weights["agrees_with_previous"] == 0.0
    # one class: every anchor right and final, so no gate can learn; CKA does not read labels
    fs.probe(store=one_class, model="synthetic", db=tmp_path / "oc.duckdb", run=QUIET)
    refused(lambda: fs.gate(tmp_path / "oc.duckdb"), "all right and final")
    assert "all right and final" in fails("gate", "--db", tmp_path / "oc.duckdb")
    same = fs.cka(one_class, "synthetic", tmp_path / "oc.duckdb").matrix
    assert np.allclose(same, fs.cka(store, "synthetic", tmp_path / "c3.duckdb").matrix)  # the same features
