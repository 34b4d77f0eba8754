"""`tuned-lens` (Belrose et al. 2023, their reference recipe) checked against a plain torch loop written here as
their train_loop.py writes it: one `nn.Linear` translator per layer zero-initialised and added residually, read by
an `Unembed` (the model's final norm, an `nn.LayerNorm`, then its head, an `nn.Linear`), autograd through KL(final
|| lens) per translator, torch's SGD (Nesterov) with transformers' linear schedule written out,
`clip_grad_norm_` over every translator, each step on the next rows of a stream of seeded permutations of the
train rows, and no translator at the final layer. On a synthetic store (no norm) and on a random-weight timm ViT
built from a state dict whose final norm and head are not the identity (its final norm checked against the
network's own forward in timm); step 0 reads the head's own output on its input; `--threads 1` and `2` alike; the
refusal of an anchor whose width is not the head input's, of a store without the final norm recorded and of a norm
that cannot be applied to pooled features; `lens` read as `head-probe`'s old name."""

from __future__ import annotations

import copy
import json

import duckdb
import numpy as np
import pytest
import torch
from synthetic import class_clusters, make_image_folder, write_feature_store

import featstore as fs_api
from featstore.store.reader import FeatureStore

from conftest import fails, run_cli

CLASSES, WIDTH = 4, 12


@pytest.fixture(scope="module")
def head() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    return (rng.normal(0, 0.4, (CLASSES, WIDTH)).astype(np.float32),
            rng.normal(0, 0.5, CLASSES).astype(np.float32))


@pytest.fixture(scope="module")
def store(tmp_path_factory, head):
    """Three anchors as wide as the head's input; the logits are the head's on the last one."""
    feats, labels = class_clusters(300, CLASSES, [WIDTH] * 3, seed=3)
    return write_feature_store(tmp_path_factory.mktemp("tl") / "s.zarr", feats, labels, CLASSES, head=head)


def probed(store, db, variant: str, threads: int = 1, model: str = "synthetic",
           anchors: int = 3) -> tuple[np.ndarray, np.ndarray, dict, dict]:
    """(pred, conf) [images, anchors], probe_fits.info by anchor and split by image id of a run of `variant`."""
    run_cli("probe", "--store", store, "--model", model, "--db", db, "--variant", variant, "--no-progress",
            "--threads", threads)
    con = duckdb.connect(str(db), read_only=True)
    (run,) = con.execute("SELECT run_id FROM runs").fetchone()
    rows = con.execute("SELECT pred, conf FROM predictions WHERE run_id = ? ORDER BY image_id, anchor",
                       [run]).fetchnumpy()
    infos = {a: json.loads(i) for a, i in con.execute("SELECT anchor, info FROM probe_fits WHERE run_id = ?",
                                                       [run]).fetchall()}
    split = dict(con.execute("SELECT image_id, split FROM images").fetchall())
    con.close()
    return rows["pred"].reshape(-1, anchors), rows["conf"].reshape(-1, anchors), infos, split


def stored_maps(store, db) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each anchor's translator as the store keeps it for the run of `db`: (A [D_head, D], b), u = A h + b."""
    con = duckdb.connect(str(db), read_only=True)
    name, version = con.execute("SELECT probe_name, probe_version FROM runs").fetchone()
    con.close()
    fs = FeatureStore(store)
    kept = fs.root["synthetic"]["probes"][name][version]
    return [(kept[a.name]["map"][0], kept[a.name]["map_bias"][0]) for a in fs.anchors("synthetic")]


def step_stream(n: int, steps: int, batch: int, seed: int) -> list[np.ndarray]:
    """The rows of each step: the next `batch` of a stream of numpy permutations of the n rows (all rows, in order,
    when `batch` >= n)."""
    if batch >= n:
        return [np.arange(n)] * steps
    rng, stream = np.random.default_rng(seed), []
    while len(stream) < steps * batch:
        stream.extend(rng.permutation(n).tolist())
    return [np.array(stream[s * batch : (s + 1) * batch]) for s in range(steps)]


def reference_lens(hs: list[np.ndarray], p: np.ndarray, unembed: torch.nn.Module, steps: int, batch: int,
                   seed: int = 0):
    """The reference recipe in float64, as tuned_lens/scripts/train_loop.py and ingredients.py write it, for the
    layers `hs` that get a translator ([n, D] train rows each) read through `unembed`: returns the translators and
    each one's KL on every step's rows."""
    width = hs[0].shape[1]
    unembed = unembed.double().requires_grad_(False)
    lens = torch.nn.ModuleList([torch.nn.Linear(width, width).double() for _ in hs])
    for translator in lens:  # TunedLens.__init__: weight.data.zero_(); bias.data.zero_()
        translator.weight.data.zero_(), translator.bias.data.zero_()
    beta = 0.9
    opt = torch.optim.SGD(lens.parameters(), lr=1.0 * (1 - beta), momentum=beta, nesterov=True, weight_decay=1e-3)
    warmup = 0  # transformers' get_linear_schedule_with_warmup(opt, 0, num_steps), its lr_lambda as written there

    def lr_lambda(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (steps - step) / max(1, steps - warmup))

    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    h = [torch.from_numpy(x).double() for x in hs]
    log_p = torch.from_numpy(p).double().log()
    history = []
    for rows in step_stream(len(p), steps, batch, seed):
        labels, losses = log_p[rows], []
        for i in range(len(h)):  # TunedLens.forward: unembed(h + translator(h)); the KL loss of train_loop.py
            logits = unembed(h[i][rows] + lens[i](h[i][rows]))
            loss = torch.sum(labels.exp() * (labels - logits.log_softmax(-1)), dim=-1).mean()
            loss.backward()
            losses.append(float(loss.detach()))
        history.append(losses)
        torch.nn.utils.clip_grad_norm_(lens.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)
        schedule.step()
    return lens, np.array(history).T  # [translators, steps]


def linear_head(weight: np.ndarray, bias: np.ndarray) -> torch.nn.Linear:
    head = torch.nn.Linear(weight.shape[1], weight.shape[0]).requires_grad_(False)
    head.weight.copy_(torch.from_numpy(weight)), head.bias.copy_(torch.from_numpy(bias))
    return head


def test_the_lens_is_the_reference_recipe_step_for_step(store, head, tmp_path):
    steps, batch = 40, 64
    db = tmp_path / "f.duckdb"
    pred, _, infos, split = probed(store, db, f"tuned-lens:steps={steps},batch={batch}")
    fs = FeatureStore(store)
    ids = fs.image_table()["image_id"]
    train = np.array([split[int(i)] == "train" for i in ids])
    xs = [fs.read("synthetic", "clean", a.name).astype(np.float32).astype(np.float64)
          for a in fs.anchors("synthetic")]
    logits = fs.read_logits("synthetic", "clean").astype(np.float32)
    p = torch.softmax(torch.from_numpy(logits), dim=-1).double().numpy()  # the trainer's targets, float32 softmax
    assert train.sum() > batch  # fresh rows each step, not the full batch
    # the last anchor is the head's input (the logits are the head's on it): no translator there
    lens, history = reference_lens([x[train] for x in xs[:2]], p[train], linear_head(*head), steps, batch)
    weight, bias = (v.astype(np.float64) for v in head)
    maps = stored_maps(store, db)
    for a, translator in enumerate([*lens, None]):
        ref_a = np.eye(WIDTH) + (0 if translator is None else translator.weight.detach().numpy())  # u = h + W h + b
        ref_b = np.zeros(WIDTH) if translator is None else translator.bias.detach().numpy()
        big_a, small_b = maps[a]
        assert np.abs(big_a - ref_a).max() < 1e-4 * max(1.0, np.abs(ref_a).max()), a
        assert np.abs(small_b - ref_b).max() < 1e-4 * max(1.0, np.abs(ref_b).max()), a
        theirs = (xs[a] @ ref_a.T + ref_b) @ weight.T + bias
        top2 = np.sort(theirs, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 1e-4
        assert (pred[clear, a] == theirs[clear].argmax(axis=1)).all(), a
        ours = np.array(infos[a]["train_kl_per_step"])
        if translator is None:
            assert ours.shape == (0,) and infos[a]["translator"] is False
            continue
        assert ours.shape == (steps,)
        assert np.allclose(ours, history[a], rtol=1e-4, atol=1e-6), (a, ours[:3], history[a, :3])
        print(f"anchor {a}: KL {history[a, 0]:.4f} -> {history[a, -1]:.4f}, ours {ours[0]:.4f} -> {ours[-1]:.4f}")
    assert history[0, -5:].mean() < 0.5 * history[0, :5].mean()  # the KL falls
    assert infos[0]["init"] == "identity" and infos[0]["map"] == "tuned lens" and infos[0]["batch"] == batch


def test_step_zero_reads_the_heads_own_output_on_its_input(store, head, tmp_path):
    pred, conf, infos, _ = probed(store, tmp_path / "f.duckdb", "tuned-lens:steps=0")
    fs = FeatureStore(store)
    x = fs.read("synthetic", "clean", fs.anchors("synthetic")[-1].name).astype(np.float64)
    logits = x @ head[0].T.astype(np.float64) + head[1]
    q = np.exp(logits - logits.max(axis=1, keepdims=True))
    q /= q.sum(axis=1, keepdims=True)
    assert (pred[:, -1] == logits.argmax(axis=1)).all()
    assert np.abs(conf[:, -1] - q.max(axis=1)).max() < 1e-5
    assert infos[2]["train_kl_per_step"] == [] and infos[2]["translator"] is False and infos[2]["train_loss"] < 1e-3


def test_one_and_two_threads_give_the_same_lens(store, tmp_path):
    one = probed(store, tmp_path / "1.duckdb", "tuned-lens:steps=60", threads=1)
    two = probed(store, tmp_path / "2.duckdb", "tuned-lens:steps=60", threads=2)
    maps_one, maps_two = stored_maps(store, tmp_path / "1.duckdb"), stored_maps(store, tmp_path / "2.duckdb")
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])
    for (a1, b1), (a2, b2) in zip(maps_one, maps_two, strict=True):
        assert np.array_equal(a1, a2) and np.array_equal(b1, b2)


def test_an_anchor_narrower_than_the_heads_input_is_refused(head, tmp_path):
    feats, labels = class_clusters(120, CLASSES, [8, WIDTH, WIDTH], seed=1)
    narrow = write_feature_store(tmp_path / "s.zarr", feats, labels, CLASSES, head=head)
    db = tmp_path / "f.duckdb"
    line = fails("probe", "--store", narrow, "--model", "synthetic", "--db", db, "--variant", "tuned-lens")
    assert "1 of 3 anchors" in line and "anchor00 (8)" in line and f"head's input ({WIDTH})" in line
    assert "--anchors anchor01,anchor02" in line and "head-probe" in line
    assert not db.exists() and "probes" not in FeatureStore(narrow).listed("synthetic")


def test_lens_is_read_as_head_probes_old_name(store, tmp_path):
    db = tmp_path / "f.duckdb"
    result = run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", "lens",
                     "--no-progress", "--threads", "1")
    assert "--variant lens: is now --variant head-probe" in result.output and "tuned-lens" in result.output
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT run_id, probe FROM runs").fetchall() == [("synthetic/clean/head-probe", "head-probe")]
    con.close()


def test_the_old_name_cannot_be_registered_for_another_variant():
    from featstore.probing.base import ProbeVariant, register

    with pytest.raises(ValueError, match="'lens' is the old name of the probe variant 'head-probe'"):
        register(type("Mine", (ProbeVariant,), {"name": "lens"}))


VIT, VIT_KEY, VIT_ANCHORS = "timm/vit_tiny_patch16_224", "timm_vit_tiny_patch16_224", ["blocks.0", "blocks.5",
                                                                                        "blocks.11", "norm"]


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    """A random-weight timm ViT-Ti at 32 px (4 patches and the CLS token, 192 wide) whose final norm and head are
    not the identity (set from a seed and saved as a state dict), built over 48 images at the blocks 0, 5 and 11
    and the final norm: (store, the timm model)."""
    import timm

    root = tmp_path_factory.mktemp("vit")
    torch.manual_seed(7)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=CLASSES)
    model = model.eval().requires_grad_(False)
    with torch.no_grad():
        model.norm.weight.copy_(1 + 0.3 * torch.randn(192)), model.norm.bias.copy_(0.2 * torch.randn(192))
        model.head.weight.copy_(0.3 * torch.randn(CLASSES, 192)), model.head.bias.copy_(0.1 * torch.randn(CLASSES))
    torch.save(model.state_dict(), root / "w.pth")
    images = make_image_folder(root / "images", n_classes=CLASSES, per_class=12, size=(40, 40), seed=2)
    run_cli("build", "--model", VIT, "--weights", root / "w.pth", "--image-size", 32, "--data", images, "--store",
            root / "s.zarr", "--anchors", ",".join(VIT_ANCHORS), "--workers", 0, "--no-progress")
    return root / "s.zarr", model


def vit_probed(store, db, variant: str, threads: int = 1):
    n = len(VIT_ANCHORS)
    pred, conf, infos, split = probed(store, db, variant, threads, model=VIT_KEY, anchors=n)
    con = duckdb.connect(str(db), read_only=True)
    (run, name, version) = con.execute("SELECT run_id, probe_name, probe_version FROM runs").fetchone()
    con.close()
    kept = FeatureStore(store).root[VIT_KEY]["probes"][name][version]
    maps = [(np.asarray(kept[a]["map"][0]), np.asarray(kept[a]["map_bias"][0])) for a in VIT_ANCHORS]
    return pred, conf, infos, split, maps, run


def test_the_build_keeps_the_vits_final_norm_and_what_each_anchor_is_to_the_head(vit):
    store, model = vit
    reading, arrays = FeatureStore(store).read_head_reading(VIT_KEY)
    assert reading["norm"] == {"module": "norm", "kind": "layer_norm", "eps": model.norm.eps, "taken": "first token"}
    assert np.array_equal(arrays["norm_weight"], model.norm.weight.numpy())
    assert np.array_equal(arrays["norm_bias"], model.norm.bias.numpy())
    assert reading["anchors"] == {"blocks.0": "translated", "blocks.5": "translated", "blocks.11": "final",
                                  "norm": "head input"}
    # what "final" claims, with timm's own modules: its LayerNorm, then its head, on the stored CLS token of the
    # last block give the stored logits
    fs = FeatureStore(store)
    last = torch.from_numpy(fs.read(VIT_KEY, "clean", "blocks.11").astype(np.float32))
    logits = fs.read_logits(VIT_KEY, "clean").astype(np.float32)
    with torch.no_grad():
        theirs = model.head(model.norm(last)).numpy()
    assert np.abs(theirs - logits).max() < 2e-2 * np.abs(logits).max()
    assert (theirs.argmax(axis=1) == logits.argmax(axis=1)).mean() > 0.95


def test_the_vit_lens_is_the_reference_recipe_through_its_final_norm(vit, tmp_path):
    store, model = vit
    steps, batch = 30, 8
    pred, conf, infos, split, maps, run = vit_probed(store, tmp_path / "f.duckdb",
                                                     f"tuned-lens:steps={steps},batch={batch}")
    fs = FeatureStore(store)
    train = np.array([split[int(i)] == "train" for i in fs.image_table()["image_id"]])
    xs = [fs.read(VIT_KEY, "clean", a).astype(np.float32).astype(np.float64) for a in VIT_ANCHORS]
    logits = fs.read_logits(VIT_KEY, "clean").astype(np.float32)
    p = torch.softmax(torch.from_numpy(logits), dim=-1).double().numpy()
    assert train.sum() > 3 * batch
    unembed = torch.nn.Sequential(copy.deepcopy(model.norm), copy.deepcopy(model.head))  # their Unembed
    lens, history = reference_lens([x[train] for x in xs[:2]], p[train], unembed, steps, batch)
    for a, translator in enumerate(lens):  # blocks.0 and blocks.5: a translator each
        ref_a = np.eye(192) + translator.weight.detach().numpy()
        ref_b = translator.bias.detach().numpy()
        assert np.abs(maps[a][0] - ref_a).max() < 1e-4 * np.abs(ref_a).max(), a
        assert np.abs(maps[a][1] - ref_b).max() < 1e-4 * max(1e-2, np.abs(ref_b).max()), a
        with torch.no_grad():
            h = torch.from_numpy(xs[a])
            theirs = unembed(h + translator(h)).numpy()
        top2 = np.sort(theirs, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 1e-3
        assert clear.mean() > 0.9 and (pred[clear, a] == theirs[clear].argmax(axis=1)).all(), a
        ours = np.array(infos[a]["train_kl_per_step"])  # float32 against float64: 1e-3 apart by the last steps
        assert np.allclose(ours, history[a], rtol=2e-3, atol=1e-5), (a, np.abs(ours / history[a] - 1).max())
        assert infos[a]["translator"] is True and infos[a]["norm"] == {"kind": "layer_norm", "eps": 1e-6}
    assert history[:, -5:].mean() < 0.7 * history[:, :5].mean()  # the KL falls
    # the final layer and the head's input: no translator, read as the model reads them (its own class on every
    # image whose top two logits are apart, and its confidence)
    q = torch.softmax(torch.from_numpy(logits), dim=-1).numpy()
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-2
    for a in (2, 3):
        assert np.array_equal(maps[a][0], np.eye(192)) and not maps[a][1].any()
        assert infos[a]["translator"] is False and infos[a]["train_kl_per_step"] == []
        assert (pred[clear, a] == logits[clear].argmax(axis=1)).all()
        assert np.abs(conf[:, a] - q.max(axis=1)).max() < 1e-2
    assert infos[2]["norm"] is not None and infos[3]["norm"] is None
    # the lens read back from the store predicts what the run wrote
    loaded = fs_api.load_probe(store, VIT_KEY, run, tmp_path / "f.duckdb")
    for a, name in enumerate(VIT_ANCHORS):
        assert np.array_equal(loaded.predict(name, fs.read(VIT_KEY, "clean", name)), pred[:, a]), name


def test_one_and_two_threads_give_the_same_vit_lens(vit, tmp_path):
    store, _ = vit
    one = vit_probed(store, tmp_path / "1.duckdb", "tuned-lens:steps=20,batch=8", threads=1)
    two = vit_probed(store, tmp_path / "2.duckdb", "tuned-lens:steps=20,batch=8", threads=2)
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])
    for (a1, b1), (a2, b2) in zip(one[4], two[4], strict=True):
        assert np.array_equal(a1, a2) and np.array_equal(b1, b2)


def test_a_norm_before_a_mean_over_tokens_is_found_and_refused(tmp_path):
    """timm's ViT with global_pool='avg' and fc_norm=False applies `norm` to every token, then takes the mean of
    the tokens after the first: no norm of a pooled vector is that. The build records it as unreadable, and the
    lens refuses such a store in one line."""
    import timm

    from featstore.nets.extraction import describe_anchors
    from featstore.nets.head_norm import head_reading

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=CLASSES,
                              global_pool="avg", fc_norm=False).eval()
    sample = torch.zeros(1, 3, 32, 32)
    anchors = describe_anchors(model, ["blocks.10", "blocks.11", "head.input"], sample, "mean").anchors
    reading, arrays = head_reading(model, anchors, sample, "mean")
    assert reading["norm"]["module"] == "norm" and "mean of the tokens after the first" in reading["norm"]["unreadable"]
    assert arrays == {} and reading["anchors"]["head.input"] == "head input"
    feats, labels = class_clusters(60, CLASSES, [WIDTH] * 2, seed=1)
    rng = np.random.default_rng(0)
    head = (rng.normal(0, 0.4, (CLASSES, WIDTH)).astype(np.float32), np.zeros(CLASSES, np.float32))
    made = write_feature_store(tmp_path / "s.zarr", feats, labels, CLASSES, head=head,
                               reading=({"norm": reading["norm"], "anchors": {"anchor00": "translated",
                                                                              "anchor01": "head input"}}, {}))
    db = tmp_path / "f.duckdb"
    line = fails("probe", "--store", made, "--model", "synthetic", "--db", db, "--variant", "tuned-lens")
    assert "final norm of 'synthetic' (norm) cannot be applied" in line and "head-probe" in line
    assert not db.exists()


def test_a_store_whose_head_was_kept_without_its_final_norm_is_refused_until_rebuilt(head, tmp_path):
    feats, labels = class_clusters(60, CLASSES, [WIDTH] * 2, seed=1)
    made = write_feature_store(tmp_path / "s.zarr", feats, labels, CLASSES, head=head)
    from featstore.store.writer import StoreWriter

    StoreWriter(made).write_head("synthetic", head[0], head[1], "fc")  # as a build kept it before the norm
    db = tmp_path / "f.duckdb"
    line = fails("probe", "--store", made, "--model", "synthetic", "--db", db, "--variant", "tuned-lens")
    assert "without its final norm" in line and "rerun the same `featstore build`" in line
    assert not db.exists()
