"""`knn`: a k-nearest-neighbour probe per anchor, as in Baldock, Maennel and Neyshabur, "Deep Learning Through the
Lens of Example Difficulty" (NeurIPS 2021), whose prediction depth reads k-NN classifiers (k = 30) on each
layer's embeddings. By default it is scikit-learn's `KNeighborsClassifier(n_neighbors=30, metric="euclidean")`
(uniform weights, brute force), the classifier public reimplementations of their protocol use; the paper names no
distance (docs/design.md §5 says what can and cannot be checked).

- References (default): the train split's rows of the training view, on the raw pooled features (no
  standardisation). "Training" is one pass that memorises them, as they come by in the trainer's mini-batches
  (float16, which is what the store holds, so the copy is exact); the store keeps which rows they were
  (`reference`, a mask over its rows per fold), never a second copy of the features. Prediction depth names them
  with its result (`prediction_depths.reference_rows`). A store built with the `input` anchor (the image on an 8x8
  grid) gives knn a probe at the input, Baldock et al.'s layer 0.
- References from another store (`knn:refs=STORE`, Baldock et al.'s own protocol: the network's *training*
  images vote, e.g. an ImageNet-train subset built with `featstore build`): every usable row of the training
  view of the same model in STORE (a folder or object-store URL), with that store's labels. STORE must hold the
  model with the same weights and anchors (widths included), the same preprocessing (resize, crop, interpolation,
  normalisation; features of another image size are other features) and pooling, and the same class names, and
  must share no image with the probed set: not the probed store itself, no image file of the same path, and none
  of the same content (the content checksums both stores record, `FeatureStore.image_stats`), since a probed image
  among the references votes for itself. Anything else is refused in one line before any work. The probed set's
  own rows are then not memorised (its one epoch passes them by);
  `reference` is the mask over STORE's rows, and `probe_fits.info` records `references_from` (STORE),
  `reference_images` (its image table's checksums) and `references`. The run id spells refs by a digest of
  STORE's location (`knn:refs=<12 hex>`: a location's slashes would nest run ids and store groups);
  `runs.params` keep STORE itself.
- Metric: `euclidean` (default) or `cosine` (distance 1 - cos). A row of zeros has cosine 0 to everything. Every
  run id spells the metric and the tie rule (`knn:metric=euclidean,ties=lowest`), so a run whose id is a plain
  `knn` (cosine, ties to the nearer voters, a database's older runs) is never taken for one of these.
- Vote: the k nearest references vote with equal weight. A tie between classes goes (`ties=lowest`, default) to the
  lowest class index among the tied, as scikit-learn's `predict` does (`np.argmax` of the counts in `classes_`
  order); `ties=nearer` to the class whose voters are nearer (smaller mean distance). Confidence
  = the winning class's share of the k votes, v/k.
- Itself: a row predicted while it is one of the references (the train split, scope all/train) is left out of
  its own neighbours (`leave_out=self`, default: scikit-learn's `kneighbors()` without X; leave-one-out), so it
  never votes for itself; `leave_out=none` keeps it. References from another store are other images.
  k must be below the number of references (k + 1 with a row left out), as scikit-learn requires.
- Prediction: blocks of query rows against tiles of `tile` references, keeping a running top k, so memory is the
  references (rows x width x 2 bytes per anchor) plus one block x tile of scores, whatever the sizes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import numpy as np
import torch

from featstore.errors import FeatstoreError, Name
from featstore.probing.base import AnchorContext, FittedProbe, Plan, ProbeGroup, ProbeVariant, register
from featstore.schema import Int, Text
from featstore.store.location import StoreLocation, StoreLocationValue
from featstore.store.reader import FeatureStore

METRICS = ("cosine", "euclidean")
TIES = ("lowest", "nearer")  # scikit-learn's rule (the lowest class among the tied); the nearer voters (old)
LEAVE_OUT = ("self", "none")  # a reference row left out of its own neighbours (leave-one-out), or voting (old)


@register
class Knn(ProbeVariant):
    name = "knn"

    parameters = {
        "k": Int(30, ge=1, help="neighbours that vote"),
        "metric": Text("euclidean", choices=METRICS, help="euclidean (scikit-learn's, as reimplementations of "
                                                            "Baldock et al.) or cosine (distance 1 - cos)"),
        "ties": Text("lowest", choices=TIES, help="a vote tie goes to the lowest class (scikit-learn) or to the "
                                                  "class whose voters are nearer"),
        "leave_out": Text("self", choices=LEAVE_OUT, help="self: a train row is left out of its own neighbours; "
                                                          "none: it votes for itself"),
        "tile": Int(8192, ge=1, help="references scored at a time (memory: a query block x tile scores)"),
        "refs": StoreLocationValue("", help="a store of the same model whose rows vote (Baldock et al.: the "
                                            "network's training images); empty: the probe-train split"),
    }

    identity_params = ("metric", "ties")

    def __init__(self, **given):
        super().__init__(**given)
        self.references: References | None = None  # set by `bind` when refs is given

    def shown_value(self, key: str, value: float | str) -> str:
        return location_digest(str(value)) if key == "refs" else super().shown_value(key, value)

    def bind(self, store: FeatureStore, key: str, train_view: str) -> None:
        if self.params["refs"]:
            self.references = References.open(self.params["refs"], store, key, train_view)
            enough_references(self.params["k"], len(self.references.rows), f"reference store {self.params['refs']}")

    def plan(self, n_fit: int) -> Plan:
        return Plan(max_epochs=1, batch_size=8192, train_on_val=False)

    def batches_anchors(self) -> bool:
        return True

    def make_group(self, ctxs) -> ProbeGroup:
        if self.params["refs"] and self.references is None:
            raise FeatstoreError(f"knn:refs={self.params['refs']}: the variant was not bound to the probed store "
                                 f"(call `bind` first)")
        vote = Vote(self.params["k"], self.params["metric"], self.params["ties"], self.params["tile"])
        if self.references is not None:
            return self.references.group(ctxs, vote)
        return Memorise(ctxs, vote, self.params["leave_out"] == "self")


@dataclass(frozen=True)
class Vote:
    """How the neighbours vote: k, the distance, the tie rule, and the references scored at a time."""

    k: int
    metric: str
    ties: str
    tile: int

    def info(self) -> dict:
        return {"metric": self.metric, "k": self.k, "ties": self.ties}


def enough_references(k: int, references: int, what: str, left_out: bool = False) -> None:
    """Refuse (one line) a vote of k among fewer references than it needs: k, and one more when a row is left out
    of its own neighbours (scikit-learn refuses n_neighbors > n_samples_fit); every vote is then v/k."""
    needed = k + int(left_out)
    if references < needed:
        raise FeatstoreError(f"knn:k={k} needs {needed} reference rows" + (" (a row is not its own neighbour)"
                             if left_out else "") + f"; {what} has {references}: lower k (knn:k=N)")


def location_digest(text: str) -> str:
    """12 hex digits naming a store location (a local path made absolute first, so a relative spelling of the
    same folder gives the same digest)."""
    location = StoreLocation.parse(text)
    spelled = str(location.path.resolve()) if location.path is not None else str(location)
    return hashlib.sha256(spelled.encode()).hexdigest()[:12]


@dataclass
class References:
    """Another store's rows as knn's references: its usable rows of one view of the same model, and their labels."""

    store: FeatureStore
    key: str
    view: str
    rows: np.ndarray  # positions of its usable rows
    labels: np.ndarray  # [len(rows)] int64
    images: str  # its image table's identity (checksums)

    @classmethod
    def open(cls, refs: str, probed: FeatureStore, key: str, view: str) -> References:
        """The reference store, checked against the probed one: the same model, weights and anchors (the
        `ModelSource` comparison, images aside) and the same class names, the view complete and sound."""
        from featstore.probing.run import check_complete

        about = {"field": "variant", "value": f"knn:refs={refs}"}  # what each refusal below is about
        try:
            store = FeatureStore(refs)
            theirs = store.source(key)
        except FeatstoreError as e:
            raise FeatstoreError(*e.whole(), **about) from None
        ours = probed.source(key)
        differ = replace(ours, images="").differences(replace(theirs, images=""), holder="the probed store")
        differ += _preprocessing_differences(probed.config(key), store.config(key))
        if store.image_attrs().get("class_names") != probed.image_attrs().get("class_names"):
            differ.append("other class names than the probed store's (its labels would mean other classes)")
        if differ:
            raise FeatstoreError(f"its {key!r} is another model's features: {'; '.join(differ)}; build "
                                 f"the reference images with the same ", Name("model"), ", ", Name("weights"),
                                 " and ", Name("anchors"), **about)
        if view not in store.views(key):
            raise FeatstoreError(f"it has no view {view!r} of {key!r} (the training view); build it there", **about)
        try:
            check_complete(store, key, view)
        except FeatstoreError as e:
            raise FeatstoreError(*e.whole(), **about) from None
        shared = _shared_images(probed, store)
        if shared:
            raise FeatstoreError(f"{shared}; the probed images would vote for themselves: build the references "
                                 f"from other images (Baldock et al.: the network's training set)", **about)
        rows = np.flatnonzero(~store.read_skipped(key, view))
        if not len(rows):
            raise FeatstoreError(f"every row of its view {view!r} is skipped; there is nothing to vote", **about)
        labels = np.asarray(store.image_table()["label"], dtype=np.int64)[rows]
        return cls(store, key, view, rows, labels, theirs.images)

    def group(self, ctxs, vote: Vote) -> ProbeGroup:
        return Referenced(self, [ctx.anchor for ctx in ctxs], ctxs[0].device, vote)

    def features_t(self, anchor: int, device: torch.device) -> torch.Tensor:
        """[D, rows] float16: one anchor's reference rows, transposed (the stored values, an exact copy)."""
        name = self.store.anchors(self.key)[anchor].name
        values = np.asarray(self.store.read(self.key, self.view, name), dtype=np.float16)[self.rows]
        return torch.from_numpy(values).to(device).T.contiguous()


def _preprocessing_differences(ours, theirs) -> list[str]:
    """How the reference store's images were made into features otherwise than the probed store's (preprocessing:
    resize, crop, interpolation, mean, std; token pooling), one phrase each."""
    said = []
    mine = ours.preprocessing.to_dict() if ours.preprocessing is not None else {}
    other = theirs.preprocessing.to_dict() if theirs.preprocessing is not None else {}
    if (ours.preprocessing is None) != (theirs.preprocessing is None):
        said.append("features not made from images where the probed store's are" if theirs.preprocessing is None
                    else "features made from images where the probed store's are not")
    for field in sorted(set(mine) & set(other)):
        if mine[field] != other[field]:
            said.append(f"{field} {other[field]} where the probed store has {mine[field]}")
    if ours.token_pool != theirs.token_pool:
        said.append(f"token pooling {theirs.token_pool} where the probed store has {ours.token_pool}")
    return said


def _image_paths(store: FeatureStore) -> np.ndarray:
    """Each image's file as the store was built from it: its recorded image root joined with its path."""
    root = str(store.image_attrs().get("root", ""))
    paths = np.asarray(store.image_table()["path"], dtype=str)
    return np.char.add(root.rstrip("/") + "/", paths) if root else paths


def _shared_images(probed: FeatureStore, refs: FeatureStore) -> str:
    """'' when the reference store shares no image with the probed one; else what is shared, in a phrase: the store
    itself, images of the same file, or images of the same content (checksums recorded by both builds)."""
    if str(refs.location) == str(probed.location) or location_digest(str(refs.location)) == location_digest(
            str(probed.location)):
        return "it is the probed store itself"
    ours, theirs = _image_paths(probed), _image_paths(refs)
    same = np.isin(theirs, ours)
    if same.any():
        return (f"{int(same.sum())} of its {len(theirs)} images are files of the probed set (the same path, e.g. "
                f"{theirs[np.flatnonzero(same)[0]]})")
    mine, other = probed.image_stats(contents=True), refs.image_stats(contents=True)
    if mine is None or other is None:
        return ""
    taken = lambda sums: (sums != 0) & (sums != -1)  # noqa: E731 - 0: not taken, -1: the file was missing
    known_mine, known_other = mine[:, 2][taken(mine[:, 2])], other[:, 2]
    same = taken(known_other) & np.isin(known_other, known_mine)
    if same.any():
        first = np.flatnonzero(same)[0]
        return (f"{int(same.sum())} of its {len(theirs)} images have the content of an image of the probed set (the "
                f"same checksum, e.g. {theirs[first]})")
    return ""


class Memorise(ProbeGroup):
    """The anchors of one width: one pass over the train rows copies them, transposed and float16, into buffers
    of the final size (no second copy is ever made), with their labels and which store row each one is."""

    def __init__(self, ctxs, vote: Vote, leave_out: bool):
        ctx0: AnchorContext = ctxs[0]
        enough_references(vote.k, ctx0.n_fit, "the probe-train split", left_out=leave_out)
        self.anchors = [ctx.anchor for ctx in ctxs]
        self.members = list(self.anchors)  # the order of the stacked features
        self.vote, self.leave_out = vote, leave_out
        self.reference = np.zeros(ctx0.store_rows, dtype=bool)
        if ctx0.fit_rows is not None:
            self.reference[ctx0.fit_rows] = True
        self.refs_t = [torch.empty(ctx.dim, ctx0.n_fit, dtype=torch.float16, device=ctx0.device) for ctx in ctxs]
        self.labels = torch.empty(ctx0.n_fit, dtype=torch.long, device=ctx0.device)
        self.positions = torch.full((ctx0.n_fit,), -1, dtype=torch.long, device=ctx0.device)
        self.next_rows: torch.Tensor | None = None
        self.rows = 0

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        return x.half()  # the stored precision: an exact copy at half the memory of float32

    def batch_rows(self, rows: torch.Tensor) -> None:
        self.next_rows = rows

    def step(self, x, y, is_val, report=False):
        stop = self.rows + len(y)
        if stop > len(self.labels):
            raise RuntimeError(f"knn was handed {stop} rows to memorise, more than the {len(self.labels)} it expected")
        for refs_t, part in zip(self.refs_t, x, strict=True):
            refs_t[:, self.rows : stop] = part.T
        self.labels[self.rows : stop] = y
        if self.next_rows is not None:
            self.positions[self.rows : stop] = self.next_rows
            self.next_rows = None
        self.rows = stop
        return None

    def end_epoch(self, epoch, val_x, val_y) -> None:
        self.anchors = []  # one pass memorises everything

    def fitted(self, val_x, val_y) -> dict[int, NeighbourFit]:
        labels = self.labels[: self.rows]
        own = None
        if self.leave_out:
            positions = self.positions[: self.rows].cpu().numpy()
            if (positions < 0).any():
                raise RuntimeError("knn was handed rows without their store positions; it cannot leave a row out")
            own = OwnRows.of(positions)
        out = {}
        for refs_t, a in zip(self.refs_t, self.members, strict=True):  # no val accuracy: the val rows are
            # predicted with every other row (probe_accuracy_by_split), so it is not computed twice here
            out[a] = NeighbourFit(refs_t[:, : self.rows], labels, self.vote, self.reference, own,
                                  info={"references": self.rows, **self.vote.info(),
                                        "leave_out": "self" if self.leave_out else "none"}, epochs=1)
        return out


class Referenced(ProbeGroup):
    """Anchors whose references are another store's rows (`References`): nothing to learn from the batches (the
    trainer's one epoch passes them by untouched); `fitted` reads each anchor's references."""

    def __init__(self, refs: References, anchors: list[int], device: torch.device, vote: Vote):
        self.refs, self.members, self.device = refs, anchors, device
        self.anchors = list(anchors)
        self.vote = vote

    def step(self, x, y, is_val, report=False):
        return None

    def end_epoch(self, epoch, val_x, val_y) -> None:
        self.anchors = []

    def fitted(self, val_x, val_y) -> dict[int, NeighbourFit]:
        mask = np.zeros(self.refs.store.num_images, dtype=bool)
        mask[self.refs.rows] = True
        labels = torch.from_numpy(self.refs.labels).to(self.device)
        info = {"references": len(self.refs.rows), **self.vote.info(),
                "references_from": str(self.refs.store.location), "reference_view": self.refs.view,
                "reference_images": self.refs.images}
        return {a: NeighbourFit(self.refs.features_t(a, self.device), labels, self.vote, mask, None,
                                info=dict(info), epochs=1) for a in self.members}


@dataclass(frozen=True)
class OwnRows:
    """Which store row each reference column is (for leaving a row out of its own neighbours), sorted for lookup."""

    sorted_rows: np.ndarray  # the store rows of the references, ascending
    columns: np.ndarray  # the reference column of each of them

    @classmethod
    def of(cls, positions: np.ndarray) -> OwnRows:
        order = np.argsort(positions, kind="stable")
        return cls(positions[order], order)

    def columns_of(self, rows: np.ndarray) -> np.ndarray:
        """Per store row its reference column, -1 where it is no reference."""
        at = np.minimum(np.searchsorted(self.sorted_rows, rows), len(self.sorted_rows) - 1)
        return np.where(self.sorted_rows[at] == rows, self.columns[at], -1)


@dataclass
class NeighbourFit(FittedProbe):
    """The references of one anchor (transposed, [D, n] float16) and their labels; predicts by majority vote."""

    refs_t: torch.Tensor
    labels: torch.Tensor  # [n] int64
    vote: Vote
    reference: np.ndarray  # [store rows] bool: which rows of the store (the reference store, refs=) they are
    own: OwnRows | None = None  # the probed store's row of each reference, when a row is left out of its own vote

    def __post_init__(self) -> None:
        squares = torch.cat([self.refs_t[:, i : i + self.vote.tile].float().pow(2).sum(dim=0)  # tile by tile
                             for i in range(0, self.refs_t.shape[1], self.vote.tile)])
        # cosine ranks by x.r / |r|; euclidean by x.r - |r|^2 / 2 (= (|x|^2 - d^2) / 2)
        cosine = self.vote.metric == "cosine"
        self.scale = squares.sqrt().clamp_min(1e-30).reciprocal() if cosine else None
        self.offset = None if cosine else -0.5 * squares
        self.classes = int(self.labels.max()) + 1 if len(self.labels) else 1

    def arrays(self) -> dict[str, np.ndarray]:
        return {"reference": self.reference}

    def neighbours(self, x: torch.Tensor, own: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Distances [n, k'] (ascending) and reference indices [n, k'] of the k' = min(k, references) nearest;
        `own` [n]: each row's own reference column (-1: none), which is never among its neighbours."""
        best = index = None
        tile_size = self.vote.tile
        for start in range(0, self.refs_t.shape[1], tile_size):
            stop = min(start + tile_size, self.refs_t.shape[1])
            tile = self.refs_t[:, start:stop].to(x.device).float()
            if self.scale is not None:  # cosine: the reference norms folded into the tile, not into the scores
                score = x @ tile.mul_(self.scale[start:stop].to(x.device))
            else:
                score = torch.addmm(self.offset[None, start:stop].to(x.device), x, tile)
            if own is not None:
                mine = torch.nonzero((own >= start) & (own < stop)).squeeze(1)
                score[mine, own[mine] - start] = -torch.inf
            score, pos = score.topk(min(self.vote.k, score.shape[1]), dim=1)
            pos += start
            if best is not None:  # merge with the running top k
                score, pick = torch.cat([best, score], dim=1).topk(min(self.vote.k, best.shape[1] + score.shape[1]),
                                                                   dim=1)
                pos = torch.cat([index, pos], dim=1).gather(1, pick)
            best, index = score, pos
        norms = x.norm(dim=1, keepdim=True)
        if self.scale is not None:
            distance = (1.0 - best / norms.clamp_min(1e-30)).clamp_min(0)
            distance = torch.where(norms > 0, distance, torch.ones_like(distance))
        else:
            distance = (norms * norms - 2.0 * best).clamp_min(0).sqrt()
        return distance, index

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.voted(*self.neighbours(x.float()))

    def predict_rows(self, x: torch.Tensor, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        if self.own is None:
            return self.predict(x)
        own = torch.from_numpy(self.own.columns_of(np.asarray(rows))).to(x.device)
        return self.voted(*self.neighbours(x.float(), own))

    def voted(self, distance: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The winning class of each row's neighbours and its share of their votes."""
        votes = self.labels.to(distance.device)[index]  # [n, k]
        same = votes[:, :, None] == votes[:, None, :]  # [n, k, k]: neighbours j and i vote alike (no [n, classes])
        counts = same.sum(dim=2)  # per neighbour, the votes of its class
        if self.vote.ties == "lowest":  # most votes first; among classes with equal votes the lowest class
            key = counts * self.classes - votes
        else:  # among classes with equal votes the smaller distance sum (a fraction below one vote)
            spread = (same * distance[:, None, :]).sum(dim=2)  # per neighbour, the distance sum of its voters
            key = counts - 0.5 * spread / (distance.sum(dim=1, keepdim=True) + 1e-30)
        winner = key.argmax(dim=1, keepdim=True)
        return votes.gather(1, winner).squeeze(1), (counts.gather(1, winner).squeeze(1) / index.shape[1]).float()
