"""What `featstore build` does about a store that `verify` would find damaged, before it computes anything: it
makes again what it can recompute from its own inputs (the image table from --data, a view whose arrays are
damaged from the network) and names, in one line, what it cannot (a model group whose config is unreadable:
what built its arrays is unknown). It also refuses image files that changed since the store was built, unless
asked to recompute the chunks that hold them. Each function returns what it repaired, as lines for the user.
"""

from __future__ import annotations

from featstore.errors import FeatstoreError, Name
from featstore.images.datasets import ImageSet
from featstore.store.integrity import UNFINISHED, changed_images, image_stats
from featstore.store.writer import StoreWriter


def repair_images(store: StoreWriter, images: ImageSet) -> list[str]:
    """Rewrite a damaged or unfinished image table from `images` when they are the images the store was built from
    (its fingerprint, or a model's config, says so), or when nothing in the store names any image list (a build
    stopped while writing the table, before any model was made: nothing was built from it); refuse otherwise,
    naming what is damaged. An unfinished table of such a store is written again without a word, as an unfinished
    view is: it was never a table (a damaged one is named)."""
    if "images" not in store.listed(""):
        return []
    damage = store.check_images_table()
    if not damage:
        return []
    known = set()
    try:
        known.add(store.image_attrs().get("fingerprint"))
    except FeatstoreError:
        pass
    models = store.models()
    for key in models:
        try:
            known.add(store.config(key).images_fingerprint)
        except FeatstoreError:
            continue
    known.discard(None)
    nothing_built = not known and not models
    if images.fingerprint() not in known and not nothing_built:
        raise FeatstoreError(f"store {store.location} is damaged: {damage[0]}; these images are not those the store "
                             f"was built from, so their table cannot be rewritten: pass the ", Name("data"), ", ",
                             Name("labels"), " and ",
                             Name("limit"), " it was built with, or use a new ", Name("store"))
    repaired = [str(d) for d in damage if d.what != UNFINISHED]
    if nothing_built:
        store.delete("images")
        return repaired  # the build writes the table as into a new store
    stats = store.image_stats(contents=False)  # as recorded: the views keep their own contents
    store.delete("images")
    store.write_images(images, stats)
    return repaired


def check_image_files(store: StoreWriter, images: ImageSet, rebuild: bool) -> list[str]:
    """Image files whose size, time (and, where recorded, content) differ from those the store was built from:
    refused naming the first, or with `rebuild` their rows' chunks marked not done in every model and view (this
    build makes its own again; each other one's next build does). A store that records no files yet records
    them now. Returns the changed files."""
    stored = store.image_stats()
    if stored is None or stored.shape != (len(images), 3):  # sizes and times; the loader records the contents
        store.record_image_stats(image_stats(images.root, images.paths, content=False))
        return []
    changed, now = changed_images(images.root, images.paths, stored)
    if not len(changed):
        return []
    names = [str(images.root / images.paths[i]) for i in changed.tolist()]
    if not rebuild:
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        raise FeatstoreError(f"image {names[0]}{more} changed since store {store.location} was built from it (size, "
                             f"modification time or content), so its features would mix old and new images; pass ",
                             Name("rebuild_changed"), " to recompute the chunks that hold them, or restore the file")
    store.undo_rows(changed)
    store.record_image_stats(now)
    return names


def repair_view(store: StoreWriter, key: str, view: str) -> list[str]:
    """A view whose arrays are damaged (unreadable metadata, a removed array, a shape that disagrees with the
    chunks) is removed, so that the build makes it again from the network."""
    if view not in store.views(key):
        return []
    damage = store.check_view_arrays(key, view)
    if damage:
        store.delete(f"{key}/{view}")
    return [str(d) for d in damage]
