"""A run's identity is stored once: in its typed columns of `runs` (which its run id spells), never again in
`runs.params`; `ProbeRun` composes its `RunIdentity`; every run id is made and read by `RunIdentity`, whose checks
are `FIELDS`'; a database an older featstore wrote is upgraded to that shape and reads the same."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import re
import shutil
import typing
from pathlib import Path

import duckdb
import numpy as np
import pytest
from synthetic import class_clusters, write_feature_store

import featstore as fs
from featstore.analytics import db as fsdb
from featstore.analytics import queries as q
from featstore.errors import FeatstoreError
from featstore.records import ProbeRun, RunIdentity
from featstore.schema import check_field
from featstore.store.reader import FeatureStore

from conftest import db_rows, run_cli

ROOT = Path(__file__).resolve().parents[1]
IDENTITY_KEYS = {"probe_id", "probe_name", "probe_version", "streamed"}
DIMS = [8, 16]
RUNS_SQL = ("SELECT run_id, model, view, train_view, cross_fit, seed, probe_id, probe_name, probe_version, streamed, "
            "C FROM runs ORDER BY run_id")


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """A small synthetic store and one database of two runs: a pinned-C linear probe with a seed and cross-fit, and
    knn (parameters of its own, no C)."""
    feats, labels = class_clusters(600, 4, DIMS, seed=11)
    root = tmp_path_factory.mktemp("identity_once")
    store = root / "s.zarr"
    write_feature_store(store, feats, labels, 4, chunk_rows=200)
    db = root / "f.duckdb"
    for args in (("--variant", "linear:C=0.5,tol=0.02", "--seed", "1", "--cross-fit", "2"),
                 ("--variant", "knn:metric=cosine",)):
        run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--no-progress", *args)
    return store, db


def _variant_params(probe_id: str) -> dict:
    """What a variant id spells, read by hand: 'linear:C=0.5,tol=0.02' -> {'C': 0.5, 'tol': 0.02}."""
    spelled = probe_id.partition(":")[2]
    return {k: json.loads(v) if re.fullmatch(r"[-0-9.e]+", v) else v
            for k, v in (kv.split("=") for kv in spelled.split(",") if kv)}


def test_a_fresh_runs_params_hold_no_identity_keys_and_its_columns_hold_the_identity(probed):
    store, db = probed
    held = db_rows(db, "SELECT run_id, probe_id, probe_name, probe_version, streamed, cross_fit, seed, params "
                    "FROM runs ORDER BY run_id")
    assert [r[0] for r in held] == ["synthetic/clean/knn:metric=cosine,ties=lowest",
                                    "synthetic/clean/linear:C=0.5,tol=0.02/cf2/seed1"]
    for run_id, probe_id, name, version, streamed, cross_fit, seed, params in held:
        params = json.loads(params)
        assert not IDENTITY_KEYS & params.keys(), (run_id, sorted(params))
        for key, value in _variant_params(probe_id).items():  # the variant's own parameters stay, as spelled
            assert params[key] == value, (run_id, key)
        parts = run_id.split("/")  # the id read by hand: model/view/variant[/cf<k>][/seed<s>]
        assert probe_id == parts[2] and streamed is False
        assert (cross_fit, seed) == ((2, 1) if parts[3:] == ["cf2", "seed1"] else (0, 0)), run_id
        assert name == parts[2] + ("-cf2-seed1" if cross_fit else "") + "@clean"
        assert FeatureStore(store).probe_version_exists("synthetic", name, version), run_id


def _old_shaped(db: Path, old: Path) -> None:
    """`db` as a featstore before the typed columns wrote it: the identity and weights' version only in params."""
    shutil.copy(db, old)
    con = duckdb.connect(str(old))
    con.execute("CREATE TABLE old_runs AS SELECT * EXCLUDE (probe_id, probe_name, probe_version, streamed, C) "
                "REPLACE (json_merge_patch(params, json_object('probe_id', probe_id, 'probe_name', probe_name, "
                "'probe_version', probe_version, 'streamed', streamed)) AS params) FROM runs; DROP TABLE runs; "
                "CREATE TABLE runs (run_id VARCHAR PRIMARY KEY, model VARCHAR, view VARCHAR, train_view VARCHAR, "
                "probe VARCHAR, params JSON, cross_fit INTEGER, seed INTEGER, n_images INTEGER, n_anchors INTEGER, "
                "store VARCHAR, created_at TIMESTAMP); INSERT INTO runs SELECT * FROM old_runs; DROP TABLE old_runs; "
                "CREATE TABLE old_fits AS SELECT * EXCLUDE (C) FROM probe_fits; DROP TABLE probe_fits; "
                "ALTER TABLE old_fits RENAME TO probe_fits")
    con.close()


def test_an_old_shaped_database_is_migrated_and_reads_the_same(probed, tmp_path):
    store, db = probed
    want = db_rows(db, RUNS_SQL)
    want_params = dict(db_rows(db, "SELECT run_id, params FROM runs"))
    summary = q.decision_summary(db, 2, "all").sort("run_id")
    old = tmp_path / "old.duckdb"
    _old_shaped(db, old)
    assert all(IDENTITY_KEYS <= json.loads(p).keys() for (p,) in db_rows(old, "SELECT params FROM runs"))
    before = hashlib.sha256(old.read_bytes()).hexdigest()
    # read-only: the same columns and params (no identity keys), the file untouched
    assert q.query(old, RUNS_SQL).rows() == want
    assert not any(IDENTITY_KEYS & json.loads(p).keys() for p in q.query(old, "SELECT params FROM runs")["params"])
    assert {r: json.loads(p) for r, p in q.query(old, "SELECT run_id, params FROM runs").rows()} == {
        r: json.loads(p) for r, p in want_params.items()}
    assert q.decision_summary(old, 2, "all").sort("run_id").equals(summary)
    assert hashlib.sha256(old.read_bytes()).hexdigest() == before
    fsdb.connect(old).close()  # a write connection upgrades the file itself
    assert db_rows(old, RUNS_SQL) == want
    assert not any(IDENTITY_KEYS & json.loads(p).keys() for (p,) in db_rows(old, "SELECT params FROM runs"))
    assert {r: json.loads(p) for r, p in db_rows(old, "SELECT run_id, params FROM runs")} == {
        r: json.loads(p) for r, p in want_params.items()}
    assert q.decision_summary(old, 2, "all").sort("run_id").equals(summary)
    run = "synthetic/clean/linear:C=0.5,tol=0.02/cf2/seed1"
    (name, version), = db_rows(old, "SELECT probe_name, probe_version FROM runs WHERE run_id = ?", [run])
    loaded = fs.load_probe(store, "synthetic", run, db=old)
    kept = FeatureStore(store).root["synthetic"]["probes"][name][version]
    assert loaded.version == version
    for i, anchor in enumerate(fs.open_store(store).model("synthetic").anchors):
        assert np.array_equal(loaded.fits[i][1].weight.numpy(), kept[anchor.name]["weight"][1])


def test_load_probe_reads_the_runs_name_and_version_from_its_columns(probed, tmp_path):
    """Two databases of one run name two versions of its weights: each loads its own, as its probe_version column
    says, and a probe_name column other than the name the run id spells is refused."""
    store, db = probed
    run = "synthetic/clean/linear:C=0.5,tol=0.02/cf2/seed1"
    first = tmp_path / "first.duckdb"
    shutil.copy(db, first)
    second = tmp_path / "second.duckdb"  # a database of its own: the first's version stays in the store
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", second, "--no-progress", "--variant",
            "linear:C=0.5,tol=0.02", "--seed", "1", "--cross-fit", "2")  # a new version, now the store's current
    ((v1,),), ((v2,),) = (db_rows(d, "SELECT probe_version FROM runs WHERE run_id = ?", [run]) for d in (first, second))
    assert v1 != v2
    assert fs.load_probe(store, "synthetic", run, db=first).version == v1
    assert fs.load_probe(store, "synthetic", run, db=second).version == v2
    con = duckdb.connect(str(first))
    con.execute("UPDATE runs SET probe_name = 'linear@clean' WHERE run_id = ?", [run])
    con.close()
    with pytest.raises(FeatstoreError, match="names probes 'linear@clean'"):
        fs.load_probe(store, "synthetic", run, db=first)


@pytest.mark.parametrize("field", ["cross_fit", "seed"])
def test_run_identity_checks_its_counts_as_fields_does(field):
    def identity(value):
        return RunIdentity("m", "clean", "linear", "clean", **{field: value})

    for bad in ((1,) if field == "cross_fit" else ()) + (-1, True, 2.5, "2", None, np.bool_(True)):
        try:
            check_field(field, bad)
        except FeatstoreError as e:
            with pytest.raises(FeatstoreError) as refused:
                identity(bad)
            assert str(refused.value) == str(e), bad
        else:
            raise AssertionError(f"FIELDS accepts {field}={bad!r}")
    for good in (0, 2, 7, np.int64(3), 4.0):
        assert getattr(identity(good), field) == check_field(field, int(good)) == int(good)
    with pytest.raises(FeatstoreError, match="no run id"):
        RunIdentity.parse("m/clean/linear/cf1")
    with pytest.raises(FeatstoreError, match="no probe name"):
        RunIdentity.from_probe_name("m", "clean", "linear-cf1@clean")


def test_probe_run_composes_its_identity():
    hints = typing.get_type_hints(ProbeRun)
    assert hints["identity"] is RunIdentity
    names = {f.name for f in dataclasses.fields(ProbeRun)}
    copied = names & ({f.name for f in dataclasses.fields(RunIdentity)} | {"run_id", "probe_name"})
    assert not copied, copied
    identity = RunIdentity("m", "noise-1", "linear:C=0.5", "clean", 3, 2, True)
    run = ProbeRun(identity, "linear", {"C": 0.5}, 10, 4, "-", "v1", 0.5)
    columns = run.columns()
    assert columns["run_id"] == "m/noise-1/linear:C=0.5/train=clean/cf3/seed2/streamed"
    assert columns["probe_name"] == "linear:C=0.5-cf3-seed2-streamed@clean"
    assert {k: columns[k] for k in ("model", "view", "train_view", "cross_fit", "seed", "probe_id", "streamed")} == {
        "model": "m", "view": "noise-1", "train_view": "clean", "cross_fit": 3, "seed": 2, "probe_id": "linear:C=0.5",
        "streamed": True}
    assert set(columns) == {c for (c,) in duckdb.connect().execute(
        (ROOT / "sql" / "schema.sql").read_text().split("-- every image at every anchor")[0]
        + "SELECT column_name FROM duckdb_columns() WHERE table_name = 'runs'").fetchall()}
    assert RunIdentity.circuit("vit_tiny", "imagenet-r", 5).run_id == "vit_tiny/imagenet-r/eap-ig5"


# a run id split by '/' (str.split, rsplit, partition, rpartition; polars' str.split too) or built by an f-string
RUN_WORDS = re.compile(r"\b(run|runs|run_id|run_ids|probe_set|circuit_run)\b")
RUN_PARTS = ("/train=", "/cf", "/seed", "/streamed", "/eap-ig")


def _context(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    """The source of what `node` is part of: its simple statement, or the header expression of a compound one."""
    while not isinstance(parents.get(node), ast.stmt | None):
        node = parents[node]
    statement = parents.get(node)
    compound = isinstance(statement, ast.If | ast.For | ast.While | ast.With | ast.FunctionDef | ast.ClassDef)
    return ast.unparse(node if compound else statement or node)


def _run_id_spellings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("split", "rsplit", "partition", "rpartition") and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "/"
                and RUN_WORDS.search(_context(node, parents))):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.JoinedStr):
            constants = [v.value for v in node.values if isinstance(v, ast.Constant)]
            if any(part in c for c in constants for part in RUN_PARTS):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_run_id_is_split_or_built_outside_run_identity():
    found = [hit for folder in ("featstore", "analytics", "workflows", "api", "probing")
             for path in sorted((ROOT / folder).rglob("*.py")) if path != ROOT / "featstore" / "records.py"
             for hit in _run_id_spellings(path)]
    assert not found, found
    # the scan finds what it looks for
    probe = ROOT / "featstore" / "records.py"
    assert any("split" in hit for hit in _run_id_spellings(probe))
