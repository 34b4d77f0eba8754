"""Whether a build's labels mean what its pretrained 1,000-way head predicts, judged on the first chunk it computes.

Labels in another class order (the devkit's ids written into a filename,label CSV) still index the head, so
nothing refuses them: the store is built, and its head scores what a head that ignores the images would (~0.1%
where ~76% is due). A head's top-1 agreement with the labels no better than that is one warning line; the build
goes on (a pretrained head may truly be that poor on some images, but that is for the user to say).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from featstore.errors import FeatstoreWarning, Name
from featstore.images.datasets import IMAGENET_CLASSES

Z = 3.0  # standard errors above chance an agreement must reach to be told apart from it


class LabelsNearChance(FeatstoreWarning):
    """A pretrained 1,000-way head agrees with the labels about as often as a head that ignores the images would:
    the labels are most likely in another class order than the head's."""


@dataclass(frozen=True)
class HeadAgreement:
    """How often a head's top-1 is the label on some rows, beside what chance gives."""

    rows: int
    agreement: float  # fraction of rows whose top-1 class is their label
    chance: float  # what a head independent of the labels agrees on: sum over classes of P(top-1 = c) P(label = c)

    @property
    def near_chance(self) -> bool:
        """Within Z binomial standard errors of chance (at least one row's worth): not told apart from it."""
        margin = Z * math.sqrt(self.chance * (1.0 - self.chance) / self.rows)
        return self.agreement <= self.chance + max(margin, 1.0 / self.rows)


def checks_labels(weights_id: str, num_classes: int) -> bool:
    """Only a pretrained (not randomly initialised) 1,000-way head says what its labels should be."""
    return num_classes == IMAGENET_CLASSES and not weights_id.startswith("none:")


def head_agreement(logits: np.ndarray, labels: np.ndarray) -> HeadAgreement | None:
    """Top-1 agreement of `logits` [rows, classes] with `labels` over the rows whose logits are finite (skipped
    images are NaN); None when no row is."""
    logits = np.asarray(logits, dtype=np.float32)
    usable = np.isfinite(logits).all(axis=1)
    if not usable.any():
        return None
    top1, labels = logits[usable].argmax(axis=1), np.asarray(labels)[usable]
    width = max(logits.shape[1], int(labels.max()) + 1)
    predicted = np.bincount(top1, minlength=width) / len(top1)
    labelled = np.bincount(labels, minlength=width) / len(labels)
    return HeadAgreement(int(usable.sum()), float(np.mean(top1 == labels)), float(predicted @ labelled))


def warn_if_near_chance(agreement: HeadAgreement, model: str, source: str) -> None:
    """One line when the head's agreement with the labels is no better than chance."""
    import warnings

    if agreement.near_chance:
        warnings.warn(LabelsNearChance(
            f"{model}'s pretrained head agrees with the labels of {source} on {agreement.agreement:.1%} of the first "
            f"chunk's {agreement.rows} images, about chance ({agreement.chance:.1%}): the labels are likely in another "
            f"class order than the head's (ImageNet: pass the devkit's ground truth with its meta.mat, or "
            f"LOC_val_solution.csv, as ", Name("labels"), "; docs/build.md)"), stacklevel=2)
