"""The tensor input path (`--decode gpu`): loader workers only read file bytes; the device does the rest.

Per batch, JPEGs are decoded together by `torchvision.io.decode_jpeg` on the build's device (nvJPEG on CUDA,
libjpeg-turbo on CPU tensors), resized with the model's own interpolation (antialiased) in groups of equal
size, centre-cropped to uint8, and every view is made batched from that crop (`View.apply_batch`).
Normalisation follows in the build's forward, as on the PIL path.

Files the device decoder does not take go through the PIL path's own decode, per image, in the workers:
anything that is not an 8-bit, 3-component (YCbCr) baseline or progressive JPEG, i.e. PNG, grayscale,
CMYK and Adobe-RGB JPEGs. A JPEG whose device decode raises is retried alone and then, if it still fails,
decoded by PIL in the main process; what PIL cannot read either becomes the batch's error string, which
the build turns into a stop or a `--skip-bad` record exactly as on the PIL path.

On CUDA a thread prepares batch i+1 on a side stream while the forward of batch i runs; the workers'
output lands in pinned memory and is copied without blocking. On CPU the batches simply take turns with
the forward (overlapping them only slows both down).
"""

from __future__ import annotations

import io
import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F

from featstore.errors import FeatstoreError
from featstore.images.datasets import ImageSet, ViewDataset, to_rgb
from featstore.images.loading import Batch, default_workers, iterate_batches
from featstore.images.preprocessing import Preprocessing
from featstore.images.views import View
from featstore.schema import DECODES


def resolve_decode(decode: str, device: torch.device) -> str:
    """auto -> gpu on CUDA, cpu elsewhere. `gpu` on a CPU device runs the tensor path on CPU tensors."""
    if decode not in DECODES:
        raise FeatstoreError(f"--decode {decode!r}: use one of {', '.join(DECODES)}")
    if decode == "auto":
        return "gpu" if device.type == "cuda" else "cpu"
    return decode


def decoder_name(decode: str, device: torch.device) -> str:
    """What the store config records: `pil`, or `torchvision-cuda` / `torchvision-cpu` for the tensor path.
    The two tensor decoders differ (nvJPEG vs libjpeg-turbo), so the device is part of the name."""
    return "pil" if decode == "cpu" else f"torchvision-{device.type}"


def input_batches(decode: str, images: ImageSet, prep: Preprocessing, views: Sequence[View], plan: list[list[int]],
                  device: torch.device, workers: int | None = None) -> Iterator[Batch]:
    """(rows, stacked views, per-image errors) per batch of `plan`, from the decoder `decode` (cpu|gpu)."""
    if decode == "cpu":
        return iterate_batches(ViewDataset(images, prep, views), plan, device, workers)
    return TensorBatches(images, prep, views, plan, device, workers)


def device_decodable(data: bytes) -> bool:
    """True for an 8-bit, 3-component baseline/extended/progressive Huffman JPEG that is not Adobe RGB:
    what nvJPEG and libjpeg-turbo decode to the same RGB as PIL. Reads the markers up to the frame header."""
    if data[:2] != b"\xff\xd8":
        return False
    i, n, adobe_rgb = 2, len(data), False
    while i + 4 <= n:
        if data[i] != 0xFF:
            return False
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker == 0xEE and data[i + 4 : i + 9] == b"Adobe" and i + 15 < n:
            adobe_rgb = data[i + 15] == 0  # transform 0: the three channels are RGB, not YCbCr
        if marker in (0xC0, 0xC1, 0xC2):
            return i + 9 < n and data[i + 4] == 8 and data[i + 9] == 3 and not adobe_rgb
        if 0xC3 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # lossless, arithmetic, ...
            return False
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return False


def pil_crop(data: bytes, prep: Preprocessing) -> torch.Tensor:
    """The PIL path's decode of one file's bytes: uint8 [3,crop,crop]."""
    with Image.open(io.BytesIO(data)) as im:
        return prep.crop_uint8(to_rgb(im))  # 16-bit and float images by their range, as the PIL path reads them


@dataclass
class EncodedBatch:
    """What a worker hands over for one batch, in a handful of tensors (one shared-memory file each, however
    many images): the device-decodable files' bytes end to end with each image's span, the crops of the files
    PIL decoded with their batch positions, per-image error strings, and the stacked noise draws of each
    gaussian_noise view."""

    rows: list[int]
    blob: torch.Tensor
    spans: list[tuple[int, int] | None]
    crops: torch.Tensor
    crop_index: list[int]
    errors: list[str | None]
    noise: dict[str, torch.Tensor] = field(default_factory=dict)

    def encoded(self, i: int) -> torch.Tensor:
        start, end = self.spans[i]
        return self.blob[start:end]

    def pin_memory(self) -> EncodedBatch:
        """Called by the DataLoader's pin-memory thread: what is copied to the device goes to pinned memory."""
        self.crops = self.crops.pin_memory()
        self.noise = {k: v.pin_memory() for k, v in self.noise.items()}
        return self


class EncodedDataset(torch.utils.data.Dataset):
    """Reads each file's bytes; decodes with PIL only the files the device decoder does not take."""

    def __init__(self, images: ImageSet, prep: Preprocessing, views: Sequence[View]):
        self.images, self.prep = images, prep
        self.noise_views = [v for v in views if v.corruption == "gaussian_noise"]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, row: int) -> tuple[int, bytes | None, torch.Tensor | None, str | None]:
        path = self.images.root / self.images.paths[row]
        try:
            data = path.read_bytes()
            if device_decodable(data):
                return row, data, None, None
            return row, None, pil_crop(data, self.prep), None
        except Exception as e:  # PIL raises many types for bad files
            return row, None, None, f"{type(e).__name__}: {e}"

    def collate(self, items: list) -> EncodedBatch:
        rows = [r for r, _, _, _ in items]
        shape = (3, self.prep.crop, self.prep.crop)
        noise = {v.name: torch.stack([v.noise(int(self.images.image_ids[r]), shape) for r in rows])
                 for v in self.noise_views}
        spans: list[tuple[int, int] | None] = []
        offset = 0
        for _, data, _, _ in items:
            spans.append(None if data is None else (offset, offset + len(data)))
            offset += 0 if data is None else len(data)
        blob = torch.frombuffer(bytearray(b"".join(d for _, d, _, _ in items if d is not None)) or bytearray(1),
                                dtype=torch.uint8)
        crop_index = [k for k, (_, _, crop, _) in enumerate(items) if crop is not None]
        crops = (torch.stack([items[k][2] for k in crop_index]) if crop_index
                 else torch.zeros(0, *shape, dtype=torch.uint8))
        return EncodedBatch(rows, blob, spans, crops, crop_index, [e for _, _, _, e in items], noise)


class TensorBatches:
    """Iterates (rows, stacked views on `device`, errors) over a batch plan; `counts` says how many images
    took each decoder (device / pil) and how many were unreadable (bad)."""

    def __init__(self, images: ImageSet, prep: Preprocessing, views: Sequence[View], plan: list[list[int]],
                 device: torch.device, workers: int | None = None):
        self.images, self.prep, self.views, self.plan, self.device = images, prep, list(views), plan, device
        self.workers = default_workers(device) if workers is None else workers
        self.dataset = EncodedDataset(images, prep, views)
        self.counts = {"device": 0, "pil": 0, "bad": 0}

    def __iter__(self) -> Iterator[Batch]:
        if self.device.type == "cuda":
            return self._overlapped()
        return (self.to_views(b) for b in self._encoded())

    def _encoded(self) -> Iterator[EncodedBatch]:
        ds = self.dataset
        if self.workers == 0:
            yield from (ds.collate([ds[r] for r in rows]) for rows in self.plan)
        elif self.device.type == "cuda":
            yield from torch.utils.data.DataLoader(ds, batch_sampler=self.plan, collate_fn=ds.collate,
                                                   num_workers=self.workers, pin_memory=True, prefetch_factor=4)
        else:
            with ThreadPoolExecutor(self.workers, thread_name_prefix="featstore-read") as pool:
                for rows in self.plan:
                    yield ds.collate(list(pool.map(ds.__getitem__, rows)))

    def to_views(self, batch: EncodedBatch) -> Batch:
        """Decode, resize, crop and make every view of one batch on the device."""
        crops, errors = self._crops(batch)
        bad = [i for i, e in enumerate(errors) if e is not None]
        if len(bad) == len(batch.rows):
            return batch.rows, [None], errors
        ids = [int(self.images.image_ids[r]) for r in batch.rows]
        stacked = [v.apply_batch(crops, ids, batch.noise.get(v.name)) for v in self.views]
        if bad:
            for x in stacked:
                x[bad] = 0  # as the PIL path's collate: a failed image is a zero image in every view
        return batch.rows, stacked, errors

    def _crops(self, batch: EncodedBatch) -> tuple[torch.Tensor, list[str | None]]:
        n, c = len(batch.rows), self.prep.crop
        crops = torch.zeros(n, 3, c, c, dtype=torch.uint8, device=self.device)
        errors = list(batch.errors)
        if batch.crop_index:
            crops[batch.crop_index] = batch.crops.to(self.device, non_blocking=True)
        jpeg = [i for i, span in enumerate(batch.spans) if span is not None]
        decoded = self._decode([batch.encoded(i) for i in jpeg])
        by_shape: dict[tuple[int, ...], list[int]] = {}
        refused = []
        for i, image in zip(jpeg, decoded, strict=True):
            if image is not None:
                by_shape.setdefault(tuple(image.shape), []).append(i)
                continue
            try:  # the device decoder refused it: the PIL path's decode, on the same bytes
                crops[i] = pil_crop(batch.encoded(i).numpy().tobytes(), self.prep).to(self.device)
                refused.append(i)
            except Exception as e:
                errors[i] = f"{type(e).__name__}: {e}"
        index = {i: k for k, i in enumerate(jpeg)}
        interpolation = InterpolationMode(self.prep.interpolation)
        for members in by_shape.values():  # one resize per distinct image size
            group = torch.stack([decoded[index[i]] for i in members])
            group = F.resize(group, [self.prep.resize], interpolation=interpolation, antialias=True)
            crops[members] = F.center_crop(group, [c])
        self.counts["device"] += sum(len(m) for m in by_shape.values())
        self.counts["pil"] += len(batch.crop_index) + len(refused)
        self.counts["bad"] += sum(e is not None for e in errors)
        return crops, errors

    def _decode(self, encoded: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """Batch decode; if the batch call raises, each image alone (None where that raises too)."""
        if not encoded:
            return []
        try:
            return list(decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device))
        except Exception:
            out: list[torch.Tensor | None] = []
            for data in encoded:
                try:
                    out.append(decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device))
                except Exception:
                    out.append(None)
            return out

    def _overlapped(self, depth: int = 2) -> Iterator[Batch]:
        """A thread turns worker batches into device batches on a side stream, `depth` batches ahead."""
        side = torch.cuda.Stream(self.device)
        main = torch.cuda.current_stream(self.device)
        ready: queue.Queue = queue.Queue(maxsize=depth)
        stop = threading.Event()

        def produce() -> None:
            try:
                with torch.cuda.device(self.device), torch.cuda.stream(side):
                    for encoded in self._encoded():
                        if stop.is_set():
                            break
                        rows, stacked, errors = self.to_views(encoded)
                        event = torch.cuda.Event()
                        event.record(side)
                        ready.put(((rows, stacked, errors), event, None))
            except BaseException as e:  # surfaced on the consumer's thread
                ready.put((None, None, e))
            ready.put(None)

        thread = threading.Thread(target=produce, name="featstore-device-input", daemon=True)
        thread.start()
        try:
            while (item := ready.get()) is not None:
                batch, event, error = item
                if error is not None:
                    raise error
                main.wait_event(event)
                for x in batch[1]:
                    if x is not None:
                        x.record_stream(main)  # the allocator must not reuse it while the forward reads it
                yield batch
        finally:
            stop.set()
            while thread.is_alive():  # unblock a producer waiting on a full queue
                try:
                    ready.get(timeout=0.1)
                except queue.Empty:
                    pass
            thread.join()
