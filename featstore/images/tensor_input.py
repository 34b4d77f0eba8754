"""The build's input path: loader workers read each file's bytes (and checksum them); the device does the rest.

Per batch, with `--decode gpu`, JPEGs are decoded together by `torchvision.io.decode_jpeg` on the build's device
(nvJPEG on CUDA, libjpeg-turbo on CPU tensors), resized with the model's own interpolation (antialiased) in groups
of equal size and centre-cropped to uint8; with `--decode cpu` the workers decode, resize and crop with PIL and hand
over the uint8 crop. Either way every view is then made on the device from that one crop (`View.apply_batch`,
noise included), so per image only the encoded file (or, from PIL, the uint8 crop) crosses to the device:
`TensorBatches.transferred` counts those bytes. Normalisation follows in the build's forward.

Files the device decoder does not take go through the PIL decode, per image, in the workers: anything that is not
an 8-bit, 3-component (YCbCr) baseline or progressive JPEG, i.e. PNG, grayscale, CMYK and Adobe-RGB JPEGs. A JPEG
whose device decode raises is retried alone and then, if it still fails, decoded by PIL; what PIL cannot read
either becomes the batch's error string, which the build turns into a stop or a `--skip-bad` record.

Each worker also checksums the bytes it read (`content_checksum`), so that the store records every file's content
without reading it a second time.

On CUDA a thread prepares batch i+1 (decode, crop, views) on a side stream while the forward of batch i runs; the
workers' output lands in pinned memory and is copied without blocking. On CPU the batches simply take turns with
the forward (overlapping them only slows both down).
"""

from __future__ import annotations

import io
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F

from featstore.errors import FeatstoreError
from featstore.images.datasets import ImageSet, to_rgb
from featstore.images.files import content_checksum, read_file
from featstore.images.loading import default_workers
from featstore.images.preprocessing import Preprocessing
from featstore.images.views import View
from featstore.schema import DECODES


def resolve_decode(decode: str, device: torch.device) -> str:
    """auto -> gpu on CUDA, cpu elsewhere. `gpu` on a CPU device runs the tensor path on CPU tensors."""
    if decode not in DECODES:
        raise FeatstoreError(f"use one of {', '.join(DECODES)}", field="decode", value=decode)
    if decode == "auto":
        return "gpu" if device.type == "cuda" else "cpu"
    return decode


def decoder_name(decode: str, device: torch.device) -> str:
    """What the store config records: `pil`, or `torchvision-cuda` / `torchvision-cpu` for the tensor path.
    The two tensor decoders differ (nvJPEG vs libjpeg-turbo), so the device is part of the name."""
    return "pil" if decode == "cpu" else f"torchvision-{device.type}"


def input_batches(decode: str, images: ImageSet, prep: Preprocessing, views: Sequence[View], plan: list[list[int]],
                  device: torch.device, workers: int | None = None) -> TensorBatches:
    """The build's `InputBatch`es over `plan`, decoded by `decode` (cpu: PIL in the workers; gpu: the device)."""
    return TensorBatches(images, prep, views, plan, device, workers, decode)


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
class EncodedItem:
    """One image as a worker hands it over: its bytes for the device decoder, or PIL's crop of them, or the error
    that stopped both; and the checksum of the bytes it read (0: unread)."""

    row: int
    data: bytes | None
    crop: torch.Tensor | None
    error: str | None
    content: int


@dataclass
class EncodedBatch:
    """A batch as the workers hand it over, in a handful of tensors (one shared-memory file each, however many
    images): the device-decodable files' bytes end to end with each image's span, the crops PIL made with their
    batch positions, per-image error strings and content checksums."""

    rows: list[int]
    blob: torch.Tensor
    spans: list[tuple[int, int] | None]
    crops: torch.Tensor
    crop_index: list[int]
    errors: list[str | None]
    content: list[int]

    def encoded(self, i: int) -> torch.Tensor:
        start, end = self.spans[i]
        return self.blob[start:end]

    def pin_memory(self) -> EncodedBatch:
        """Called by the DataLoader's pin-memory thread: what is copied to the device goes to pinned memory."""
        self.crops = self.crops.pin_memory()
        return self


@dataclass
class InputBatch:
    """What the forward takes: the batch's rows, each view as uint8 (clean) or float [B,3,H,W] on the device
    (None when no image of the batch could be read), per-image errors, and each file's content checksum."""

    rows: list[int]
    views: list[torch.Tensor] | None
    errors: list[str | None]
    content: list[int]


class EncodedDataset(torch.utils.data.Dataset):
    """Reads each file's bytes once, checksums them, and decodes with PIL only what the device decoder will not
    take (everything, with `device_decode=False`: the `--decode cpu` path)."""

    def __init__(self, images: ImageSet, prep: Preprocessing, device_decode: bool = True):
        self.root, self.paths, self.prep, self.device_decode = str(images.root), images.paths, prep, device_decode

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, row: int) -> EncodedItem:
        data, content = None, 0
        try:
            data = read_file(os.path.join(self.root, self.paths[row]))
            content = content_checksum(data)
            if self.device_decode and device_decodable(data):
                return EncodedItem(row, data, None, None, content)
            return EncodedItem(row, None, pil_crop(data, self.prep), None, content)
        except Exception as e:  # PIL raises many types for bad files
            return EncodedItem(row, None, None, f"{type(e).__name__}: {e}", content)

    def collate(self, items: list[EncodedItem]) -> EncodedBatch:
        shape = (3, self.prep.crop, self.prep.crop)
        spans: list[tuple[int, int] | None] = []
        offset = 0
        for item in items:
            spans.append(None if item.data is None else (offset, offset + len(item.data)))
            offset += 0 if item.data is None else len(item.data)
        blob = torch.frombuffer(bytearray(b"".join(i.data for i in items if i.data is not None)) or bytearray(1),
                                dtype=torch.uint8)
        crop_index = [k for k, item in enumerate(items) if item.crop is not None]
        crops = (torch.stack([items[k].crop for k in crop_index]) if crop_index
                 else torch.zeros(0, *shape, dtype=torch.uint8))
        return EncodedBatch([i.row for i in items], blob, spans, crops, crop_index, [i.error for i in items],
                            [i.content for i in items])


class TensorBatches:
    """Iterates `InputBatch`es over a batch plan. `counts` says how many images took each decoder (device / pil)
    and how many were unreadable (bad); `transferred` how many bytes crossed from the host to the device."""

    def __init__(self, images: ImageSet, prep: Preprocessing, views: Sequence[View], plan: list[list[int]],
                 device: torch.device, workers: int | None = None, decode: str = "gpu"):
        self.images, self.prep, self.views, self.plan, self.device = images, prep, list(views), plan, device
        self.workers = default_workers(device, decode) if workers is None else workers
        self.dataset = EncodedDataset(images, prep, device_decode=decode == "gpu")
        self.counts = {"device": 0, "pil": 0, "bad": 0}
        self.transferred = 0

    def __iter__(self) -> Iterator[InputBatch]:
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

    def to_views(self, batch: EncodedBatch) -> InputBatch:
        """Decode, resize, crop and make every view of one batch on the device."""
        crops, errors = self._crops(batch)
        bad = [i for i, e in enumerate(errors) if e is not None]
        if len(bad) == len(batch.rows):
            return InputBatch(batch.rows, None, errors, batch.content)
        ids = [int(self.images.image_ids[r]) for r in batch.rows]
        stacked = [v.apply_batch(crops, ids) for v in self.views]
        if bad:
            for x in stacked:
                x[bad] = 0  # a failed image is a zero image in every view
        return InputBatch(batch.rows, stacked, errors, batch.content)

    def _to_device(self, x: torch.Tensor) -> torch.Tensor:
        """The one place a host tensor moves to the device (counted in `transferred`)."""
        self.transferred += x.nbytes
        return x.to(self.device, non_blocking=True)

    def _crops(self, batch: EncodedBatch) -> tuple[torch.Tensor, list[str | None]]:
        n, c = len(batch.rows), self.prep.crop
        crops = torch.zeros(n, 3, c, c, dtype=torch.uint8, device=self.device)
        errors = list(batch.errors)
        if batch.crop_index:
            crops[batch.crop_index] = self._to_device(batch.crops)
        jpeg = [i for i, span in enumerate(batch.spans) if span is not None]
        decoded = self._decode([batch.encoded(i) for i in jpeg])
        by_shape: dict[tuple[int, ...], list[int]] = {}
        refused = []
        for i, image in zip(jpeg, decoded, strict=True):
            if image is not None:
                by_shape.setdefault(tuple(image.shape), []).append(i)
                continue
            try:  # the device decoder refused it: the PIL path's decode, on the same bytes
                crops[i] = self._to_device(pil_crop(batch.encoded(i).numpy().tobytes(), self.prep))
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
        self.transferred += sum(e.nbytes for e in encoded)  # the decoder copies the files' bytes to the device
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

    def _overlapped(self, depth: int = 2) -> Iterator[InputBatch]:
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
                        batch = self.to_views(encoded)
                        event = torch.cuda.Event()
                        event.record(side)
                        ready.put((batch, event, None))
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
                for x in batch.views or []:
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
