"""Reading an image file's bytes, and the checksum of its content the store records; no torch, no decoder, so the
store's integrity code (read by `featstore info` and `verify`) can use it too."""

from __future__ import annotations

import hashlib
import os

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # the files read


def read_file(path: str) -> bytes:
    """A file's bytes with a few system calls and no Python file object (the workers read thousands a second)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        parts = [os.read(fd, max(size, 1))]
        while parts[-1]:  # a file that grew since fstat, or a short read
            parts.append(os.read(fd, 1 << 20))
        return b"".join(parts)
    finally:
        os.close(fd)


def content_checksum(data: bytes) -> int:
    """A file's content as the store records it (`images/stat`, the views' `image_content`): a nonzero signed 64-bit
    blake2b of its bytes."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True) or 1
