"""fs.Probe is a scikit-learn estimator by scikit-learn's own checks (`check_estimator`, with the checks expected to
fail declared and explained), usable by its tools (`cross_val_score`, `clone`), with `classes_` from np.unique(y)
whatever the labels are; its predictions are scikit-learn's LogisticRegression's at the same C on standardised
features."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone, is_classifier
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import check_estimator

import featstore as fs

# checks fs.Probe is expected to fail, and why (scikit-learn's own mechanism: check_estimator's
# expected_failed_checks); every other check runs and must pass
EXPECTED_FAILURES: dict[str, str] = {}


def _blobs(seed: int, labels: list, rows: int = 240, width: int = 6):
    """Gaussian classes around separated centres, labelled `labels` (any values)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=2.5, size=(len(labels), width))
    which = np.arange(rows) % len(labels)
    X = (centres[which] + rng.normal(size=(rows, width))).astype(np.float32)
    return X, np.asarray(labels, dtype=object if isinstance(labels[0], str) else None)[which]


def test_probe_passes_scikit_learns_check_estimator():
    check_estimator(fs.Probe("linear"), expected_failed_checks=EXPECTED_FAILURES)


@pytest.mark.parametrize("labels", [[10, 20, 30], ["cat", "dog", "eel", "fox"], [-1, 1], [0.0, 2.0, 5.0]])
def test_classes_are_the_unique_labels_and_predictions_are_logistic_regressions(labels):
    X, y = _blobs(1, labels)
    test = np.arange(len(y)) % 5 == 0
    probe = fs.Probe("linear", C=0.5).fit(X[~test], y[~test])
    assert probe.classes_.tolist() == sorted(set(labels)) and probe.predict_proba(X).shape == (len(y), len(labels))
    scaler = StandardScaler().fit(X[~test].astype(np.float64))
    # two classes: scikit-learn fits one logit v; the probe's softmax two, w1 = -w0 = v/2 at its optimum, whose
    # penalty |w0|^2 + |w1|^2 = |v|^2 / 2 is scikit-learn's at twice the C
    same = 0.5 * (2 if len(labels) == 2 else 1)
    theirs = LogisticRegression(C=same, tol=1e-10, max_iter=10_000).fit(scaler.transform(X[~test].astype(np.float64)),
                                                                        y[~test])
    ours = probe.predict(X)
    assert ours.dtype == np.asarray(y).dtype or ours.dtype.kind == np.asarray(y).dtype.kind
    assert (ours == theirs.predict(scaler.transform(X.astype(np.float64)))).all()
    np.testing.assert_allclose(probe.predict_proba(X), theirs.predict_proba(scaler.transform(X.astype(np.float64))),
                               atol=2e-3)
    assert probe.score(X[test], y[test]) == pytest.approx(np.mean(ours[test] == y[test]))


def test_cross_val_score_runs_the_folds_scikit_learn_makes():
    X, y = _blobs(2, [3, 7, 11])
    assert is_classifier(fs.Probe("linear"))
    scores = cross_val_score(fs.Probe("linear"), X, y, cv=3)
    expected = []
    for train, test in StratifiedKFold(3).split(X, y):  # what cv=3 means for a classifier, fitted here by hand
        fitted = fs.Probe("linear").fit(X[train], y[train])
        expected.append(np.mean(fitted.predict(X[test]) == y[test]))
    np.testing.assert_array_equal(scores, expected)
    assert scores.min() > 0.8


def test_init_and_set_params_only_store_and_fit_checks():
    odd = fs.Probe("lin", Cee=1, val_frac=7)  # stored, as scikit-learn's clone and grid search need
    assert odd.get_params()["Cee"] == 1 and clone(odd).get_params() == odd.get_params()
    X, y = _blobs(3, [0, 1])
    with pytest.raises(fs.FeatstoreError, match="unknown probe variant 'lin'"):
        odd.fit(X, y)
    with pytest.raises(fs.FeatstoreError, match="no parameter 'Cee'"):
        fs.Probe("linear", Cee=1).fit(X, y)
    with pytest.raises(ValueError, match="val_frac=7"):
        fs.Probe("linear").set_params(val_frac=7).fit(X, y)
