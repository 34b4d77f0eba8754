"""The `linear` probe at ImageNet's class count: converged by its criterion, recorded per anchor, as accurate
as scikit-learn's standardised LogisticRegression; an unconverged probe says so (warning, table, report);
anchors of equal width train as one batched group; one progress bar per fit."""

from __future__ import annotations

import warnings

import duckdb
import numpy as np
import pytest
from synthetic import pooled_activations, write_feature_store
from test_probe import probe_accuracy, sklearn_accuracy

from featstore.compute.specs import RunOptions
from featstore.probing import trainer
from featstore.probing.base import UnconvergedProbe
from featstore.probing.split import make_split
from featstore.workflows.probe import ProbeConfig, probe

from conftest import fails, run_cli

DIMS = [32, 32, 48]  # two anchors of one width: one batched group, and one alone


@pytest.fixture(scope="module")
def imagenet_shaped(tmp_path_factory):
    """1,000 classes x 10 rows (7 fit rows per class), features with dominant directions."""
    feats, labels = pooled_activations(1000, 10, DIMS, seed=5, separation=(2.0, 3.5))
    path = tmp_path_factory.mktemp("in1k") / "s.zarr"
    write_feature_store(path, feats, labels, 1000, chunk_rows=2048)
    return path, feats, labels


def fits_table(db) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT anchor, epochs, converged, train_loss, val_loss, val_accuracy FROM probe_fits "
                       "ORDER BY anchor").fetchall()
    con.close()
    return rows


@pytest.fixture(scope="module")
def default_fit(imagenet_shaped, tmp_path_factory):
    """The default probe of the 1,000-class store fitted once, through the CLI at --threads 1 with its bar on (three
    tests read it): the database, the anchor groups the fit made, its progress bars and the warnings it raised."""
    from featstore.probing.linear import Linear

    store, _, _ = imagenet_shaped
    db = tmp_path_factory.mktemp("default") / "f.duckdb"
    made, bars = [], []
    real_make, real_progress = Linear.make_group, trainer._Progress
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patch.setattr(Linear, "make_group", lambda self, ctxs: made.append([c.anchor for c in ctxs])
                      or real_make(self, ctxs))
        patch.setattr(trainer, "_Progress", lambda *a: bars.append(real_progress(*a)) or bars[-1])
        run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--threads", "1")
    return db, made, bars, [w.message for w in caught]


def test_1000_classes_match_standardised_sklearn_and_converge(imagenet_shaped, default_fit):
    _, feats, labels = imagenet_shaped
    db, _, _, caught = default_fit
    assert not [w for w in caught if isinstance(w, UnconvergedProbe)], caught
    split = make_split(np.arange(len(labels)))
    ours = probe_accuracy(db, "synthetic/clean/linear")
    theirs = [sklearn_accuracy(x, labels, split, standardise=True) for x in feats]
    diffs = [o - t for o, t in zip(ours, theirs, strict=True)]
    assert min(diffs) >= -0.01 and np.mean(diffs) >= -0.005, (ours, theirs)
    assert min(ours) > 0.05  # far above chance (0.001): the comparison means something
    for anchor, epochs, converged, train_loss, val_loss, val_accuracy in fits_table(db):
        assert converged and 2 <= epochs < 11 * 1000, anchor  # passes over the rows, the C path's included
        assert 0 < train_loss < np.log(1000) and val_loss > 0 and 0 < val_accuracy <= 1


@pytest.mark.parametrize(("variant", "budget", "cap"), [("linear:max_iterations=2", "4GB", "max_iterations"),
                                                          ("linear:max_epochs=2", "0", "max_epochs")])
def test_a_capped_probe_is_reported_unconverged(imagenet_shaped, tmp_path, variant, budget, cap):
    """Both caps: L-BFGS iterations (rows in memory) and SGD epochs (rows streamed); the warning names the one
    that stopped the fit."""
    from featstore.analytics.report import write_report

    store, _, _ = imagenet_shaped
    db = tmp_path / "f.duckdb"
    with pytest.warns(UnconvergedProbe, match=f"{cap}=2"):
        probe(ProbeConfig(store=store, model="synthetic", db=db, variant=variant, memory_budget=budget,
                          run=RunOptions(progress=False)))
    fits = fits_table(db)
    assert [converged for _, _, converged, *_ in fits] == [False] * len(DIMS)
    if cap == "max_epochs":
        assert [epochs for _, epochs, *_ in fits] == [2] * len(DIMS)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM unconverged_probes").fetchone() == (len(DIMS),)
    con.close()
    page = write_report(db, tmp_path / "report").read_text()
    assert "unconverged probes" in page and cap in page


def test_the_unconverged_warning_names_each_variants_own_cap_parameter(imagenet_shaped, tmp_path):
    """The paper variant's cap is `epochs`: the hint must be a variant spec that the paper variant accepts (named as
    the field a Python caller sets; the CLI says it as --variant)."""
    from featstore.probing.base import get_variant

    store, _, _ = imagenet_shaped
    with pytest.warns(UnconvergedProbe, match="raise it with variant='paper:epochs=N'$") as caught:
        probe(ProbeConfig(store=store, model="synthetic", db=tmp_path / "p.duckdb", variant="paper:epochs=1",
                          run=RunOptions(progress=False)))
    hint = str(caught[0].message).rsplit("variant=", 1)[1].strip("'").replace("=N", "=3")
    assert get_variant(hint).params["epochs"] == 3  # the hint parses


def test_anchors_of_one_width_train_as_one_group(default_fit):
    """One group per width, and one progress bar for the whole fit (not one per epoch)."""
    _, made, bars, _ = default_fit
    assert made == [[0, 1], [2]]
    assert len(bars) == 1 and bars[0].bar.total == 3  # one bar, counting the 3 anchors fitted
    assert bars[0].bar.n == 3 and bars[0].read > 2 * 7000  # every anchor done; rows of every epoch, on one bar


def test_the_thread_count_of_each_fit_is_recorded(imagenet_shaped, default_fit, tmp_path):
    """A fit's float sums depend on how many threads split them, so the count is kept with every fit."""
    store, _, _ = imagenet_shaped
    db = default_fit[0]
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT list(DISTINCT info->>'threads') FROM probe_fits").fetchone() == (["1"],)
    con.close()
    assert "--threads" in fails("probe", "--store", store, "--model", "synthetic", "--db", tmp_path / "g.duckdb",
                                "--threads", "0")
    assert not (tmp_path / "g.duckdb").exists()
