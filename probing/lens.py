"""`lens-direct`: per anchor, a direct D x C linear readout of the model's own final distribution (tuned-lens
style: Belrose et al., "Eliciting Latent Predictions from Transformers with the Tuned Lens", 2023, one affine map
per layer trained to match the final output). It is `linear` (same standardisation, L2 strength chosen on the
val rows, solve to the optimum) with the model's head as the target instead of the label: the objective is the
cross-entropy against softmax(stored logits of the training view), i.e. KL(head || lens) plus the head's own
entropy, a constant. Its classes are the head's (its width may exceed the labelled classes), and its val
"accuracy" is agreement with the head's argmax; `head_agreement(scope)` gives it per anchor on any split.

Unlike Belrose et al., the map reads the pooled anchor features (not the residual stream through the model's own
unembedding) and the target is the model's softmax at temperature 1.

The name `lens` runs `head-probe`, the map read through the model's own head (`probing/translator.py`), and
Belrose et al.'s recipe is `tuned-lens` (`probing/tuned_lens.py`). A database's `lens` runs whose `runs.params`
hold this variant's parameters (C, lr_low, ...) are this map; the translator's hold no lr_low, and its
`probe_fits.info` says "map": "translator"."""

from __future__ import annotations

from featstore.probing.base import register
from featstore.probing.linear import Linear


@register
class LensDirect(Linear):
    name = "lens-direct"
    learns_from = "model"
