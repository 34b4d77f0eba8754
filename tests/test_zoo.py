"""featstore zoo: the TOML file's checks, the evaluation macros against scipy on a hand-made zoo, the CSS graph
distances against plain numpy / scipy on small graphs, and a tiny end-to-end run through the CLI."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import timm
import torch
from scipy.stats import kendalltau, linregress, spearmanr

from featstore.analytics import db as fsdb
from featstore.analytics.circuit_graphs import HEAT_TIMES, graph_distances, store_graph_css, top_n_adjacency
from featstore.analytics.queries import query
from featstore.records import CircuitRun, ZooRow

from conftest import fails, reference_batch, run_cli

MODELS = ["m0", "m1", "m2", "m3", "m4", "m5"]


@pytest.fixture(scope="module")
def zoo_db(tmp_path_factory):
    """Six models, one ID and two OOD circuits each over a fixed 40-edge list, and accuracies with ties."""
    rng = np.random.default_rng(7)
    db = tmp_path_factory.mktemp("zoo") / "f.duckdb"
    con = fsdb.connect(db)
    layers, n = 4, 40
    src_layer = rng.integers(-1, layers, n)
    dst_layer = np.minimum(src_layer + rng.integers(1, layers + 1, n), layers)
    names = [(f"s{i % 7}", f"d{i % 5}" + (".q" if i % 3 == 0 else ""), int(a), int(b))
             for i, (a, b) in enumerate(zip(src_layer, dst_layer, strict=True))]
    accuracy = {"id": [0.9, 0.8, 0.8, 0.95, 0.7, 0.85], "blur": [0.5, 0.6, 0.6, 0.7, 0.3, 0.6],
                "noise": [0.4, 0.2, 0.35, 0.5, 0.1, 0.45]}
    for i, model in enumerate(MODELS):
        base = rng.normal(0, 1, n) * np.where(src_layer >= 2, 1 + i / 3, 1)  # deeper reliance with i
        rows = []
        for dataset, shift in (("id", 0.0), ("blur", 0.3 + 0.1 * i), ("noise", 0.6)):
            scores = base + rng.normal(0, shift, n) if shift else base
            run = CircuitRun(f"{model}/{dataset}/eap-ig5", model, dataset, layers, 2, 5, 10, len(names), {})
            fsdb.write_circuit(con, run, names, scores)
            rows.append(ZooRow("hand", model, dataset, "id" if dataset == "id" else "ood", accuracy[dataset][i], 10,
                               run.run_id))
        fsdb.replace_zoo_runs(con, rows)
    pairs = [(f"{m}/id/eap-ig5", f"{m}/{d}/eap-ig5") for m in MODELS for d in ("blur", "noise")]
    store_graph_css(con, pairs, 12)
    con.close()
    return db, accuracy


def test_zoo_points_pair_each_metric_with_its_target(zoo_db):
    db, accuracy = zoo_db
    points = query(db, "SELECT * FROM zoo_points([0.3], 12) WHERE ood_set = 'blur' ORDER BY model")
    ddb = points.filter(points["metric"] == "ddb_out")
    expected = query(db, "SELECT model, ddb FROM ddb(tau := 0.3, variant := 'out') WHERE view = 'id' ORDER BY model")
    assert ddb["x"].to_list() == pytest.approx(expected["ddb"].to_list())
    assert ddb["y"].to_list() == pytest.approx(accuracy["blur"])
    css = points.filter(points["metric"] == "css_srcc")
    assert css["y"].to_list() == pytest.approx(np.subtract(accuracy["id"], accuracy["blur"]).tolist())
    one = query(db, "SELECT css FROM css('m2/id/eap-ig5', 'm2/blur/eap-ig5', distance := 'srcc')")["css"][0]
    assert css["x"][2] == pytest.approx(one)
    metrics = set(points["metric"])
    assert metrics == {"ddb_global", "ddb_deep", "ddb_out", "id_accuracy", "css_srcc", "css_cosine", "css_l2",
                       "css_jaccard", "css_laplacian", "css_netlsd"}


def test_zoo_correlations_equal_scipy(zoo_db):
    db, _ = zoo_db
    points = query(db, "SELECT * FROM zoo_points([0.3, 0.5], 12)")
    stats = query(db, "SELECT * FROM zoo_stats([0.3, 0.5], 12)")
    assert len(stats) == 2 * 10 * 2  # OOD sets x metrics x taus
    for row in stats.iter_rows(named=True):
        group = points.filter((points["ood_set"] == row["ood_set"]) & (points["metric"] == row["metric"])
                              & (points["tau"] == row["tau"])).sort("model")
        x, y = group["x"].to_numpy(), group["y"].to_numpy()
        assert row["n_models"] == len(x) == 6
        assert row["r2"] == pytest.approx(linregress(x, y).rvalue ** 2, abs=1e-9), row
        assert row["spearman"] == pytest.approx(spearmanr(x, y).statistic, abs=1e-9), row
        assert row["kendall"] == pytest.approx(kendalltau(x, y).statistic, abs=1e-9), row  # tau-b, with ties
    table = query(db, "SELECT * FROM zoo_eval(tau := 0.5, top_n := 12)")
    half = stats.filter(stats["tau"] == 0.5)
    assert table.select("ood_set", "metric").rows() == half.select("ood_set", "metric").rows()
    assert table["spearman"].to_numpy() == pytest.approx(half["spearman"].to_numpy())
    sweep = query(db, "SELECT DISTINCT metric, tau FROM zoo_tau_sweep(taus := [0.3, 0.4, 0.5]) ORDER BY ALL").rows()
    assert sweep == [(f"ddb_{v}", t) for v in ("deep", "global", "out") for t in (0.3, 0.4, 0.5)]


def numpy_graph(edges: list[tuple[int, int]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Laplacian spectrum and NetLSD heat trace by their definitions: loops, eig and a matrix exponential."""
    a = np.zeros((n, n))
    for u, v in edges:
        if u != v:
            a[u, v] = a[v, u] = 1
    lap = -a.copy()
    for i in range(n):
        lap[i, i] = a[i].sum()
    sym = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if a[i].sum() and a[j].sum():
                sym[i, j] = (i == j) - a[i, j] / np.sqrt(a[i].sum() * a[j].sum())
    spectrum = np.sort(np.linalg.eigvals(lap).real)
    trace = np.array([np.trace(scipy.linalg.expm(-t * sym)) for t in HEAT_TIMES]) / n
    return spectrum, trace


def test_graph_distances_equal_numpy_on_small_graphs():
    nodes = ["input", "a0.h0", "a0.h1", "m0", "logits"]
    src = ["input", "input", "input", "a0.h0", "input", "a0.h1", "m0", "a0.h0"]
    dst = ["a0.h0.q", "a0.h0.k", "a0.h1.v", "m0", "m0", "m0", "logits", "logits"]
    x = np.array([3.0, -2.5, 0.1, 2.0, -0.2, 1.5, -4.0, 0.3])
    y = np.array([0.2, -2.5, 3.0, 2.0, -1.9, 0.1, -4.0, 1.0])
    # top 5 by |score|, q and k of one head merged: x keeps input-a0.h0, a0.h0-m0, a0.h1-m0, m0-logits
    index = {n: i for i, n in enumerate(nodes)}
    top_x = [(0, 1), (1, 3), (2, 3), (3, 4)]
    top_y = [(0, 2), (1, 3), (0, 3), (0, 1), (3, 4)]
    assert (top_n_adjacency(src, dst, x, 5, nodes) == numpy_adjacency(top_x, 5)).all()
    assert (top_n_adjacency(src, dst, y, 5, nodes) == numpy_adjacency(top_y, 5)).all()
    assert index["m0"] == 3
    (sx, hx), (sy, hy) = numpy_graph(top_x, 5), numpy_graph(top_y, 5)
    found = graph_distances(numpy_adjacency(top_x, 5), numpy_adjacency(top_y, 5))
    assert found["laplacian"] == pytest.approx(np.linalg.norm(sx - sy), abs=1e-9)
    assert found["netlsd"] == pytest.approx(np.linalg.norm(hx - hy), abs=1e-9)
    assert found["netlsd"] > 0.01 and found["laplacian"] > 0.1


def numpy_adjacency(edges: list[tuple[int, int]], n: int) -> np.ndarray:
    a = np.zeros((n, n))
    for u, v in edges:
        a[u, v] = a[v, u] = 1
    return a


def test_stored_graph_distances_are_read_by_css(zoo_db):
    db, _ = zoo_db
    con = fsdb.connect(db, read_only=True)
    src, dst, x = fsdb.read_edges(con, "m1/id/eap-ig5")
    _, _, y = fsdb.read_edges(con, "m1/noise/eap-ig5")
    con.close()
    nodes = sorted({s for s in src} | {d.removesuffix(".q") for d in dst})
    expected = graph_distances(top_n_adjacency(src, dst, x, 12, nodes), top_n_adjacency(src, dst, y, 12, nodes))
    for distance in ("laplacian", "netlsd"):
        got = query(db, "SELECT * FROM css('m1/id/eap-ig5', 'm1/noise/eap-ig5', distance := ?, top_n := 12)",
                    [distance])
        assert got["css"][0] == pytest.approx(expected[distance]) and got["n_edges"][0] == 40


def write_zoo(folder, image_dir, models: list[str], extra: str = "") -> str:
    lines = [f'study = "tiny"\n{extra}\n[id]\ndata = "{image_dir}"\n', '[[ood]]\nname = "noise"\n'
             'view = "gaussian_noise-5"\n']
    for name in models:
        lines.append(f'[[models]]\nname = "{name}"\nmodel = "test_vit"\nweights = "{name}.pth"\nimage_size = 32\n')
    path = folder / "zoo.toml"
    path.write_text("\n".join(lines))
    return path


@pytest.mark.parametrize(("models", "extra", "message"), [
    (["a", "b"], "", "a zoo needs at least 3 models"),
    (["a", "b", "a"], "", "model name 'a' appears twice"),
    (["a", "b", "c"], "colour = 1", "unknown key 'colour'"),
])
def test_zoo_file_problems_are_one_line(tmp_path, image_dir, models, extra, message):
    db = tmp_path / "f.duckdb"
    assert message in fails("zoo", write_zoo(tmp_path, image_dir, models, extra), "--db", db)
    assert not db.exists()


def test_zoo_command_end_to_end(tmp_path, image_dir):
    for seed, name in enumerate(["a", "b", "c"]):
        torch.manual_seed(seed)
        torch.save(timm.create_model("test_vit", img_size=32, num_classes=3).state_dict(), tmp_path / f"{name}.pth")
    db = tmp_path / "f.duckdb"
    out = run_cli("zoo", write_zoo(tmp_path, image_dir, ["a", "b", "c"]), "--db", db, "--ig-steps", "1",
                  "--workers", "0", "--top-n", "20", "--format", "csv", "--no-progress").output
    assert out.splitlines()[0] == "study,ood_set,metric,target,tau,n_models,r2,spearman,kendall"
    assert len(out.splitlines()) == 1 + 10
    runs = query(db, "SELECT model, dataset, role, accuracy, circuit_run FROM zoo_runs ORDER BY ALL").rows()
    assert [r[:3] for r in runs] == [(m, d, r) for m in "abc" for d, r in (("id", "id"), ("noise", "ood"))]
    assert query(db, "SELECT count(*) AS n FROM css_graph")["n"][0] == 3 * 2
    # the stored accuracy is the head's own, computed here with timm and torchvision's transforms
    prep = query(db, "SELECT params->>'$.preprocessing' AS p FROM circuit_runs WHERE run_id = 'b/id/eap-ig1'")["p"][0]
    import json

    from featstore.images.datasets import discover

    images = discover(image_dir)
    model = timm.create_model("test_vit", img_size=32, num_classes=3).eval()
    model.load_state_dict(torch.load(tmp_path / "b.pth", weights_only=True))
    with torch.no_grad():
        pred = model(reference_batch([images.root / p for p in images.paths], json.loads(prep))).argmax(1).numpy()
    assert runs[2][3] == pytest.approx(float((pred == images.labels).mean()))


def test_a_database_from_before_the_zoo_tables_still_answers_read_only(tmp_path):
    import duckdb

    db = tmp_path / "old.duckdb"
    fsdb.connect(db).close()
    con = duckdb.connect(str(db))
    con.execute("DROP TABLE css_graph")
    con.execute("DROP TABLE zoo_runs")
    con.close()
    assert len(query(db, "SELECT * FROM zoo_eval()")) == 0
    assert "ddb" in run_cli("ddb", "--db", db, "--format", "csv").output
