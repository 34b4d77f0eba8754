"""Where a store lives (`--store`): a local folder or an object-store URL, and all that featstore needs from
either: a Zarr store over it, whether a featstore store is there, and the writer locks (flock on local disk,
leases on object storage). Nothing else in featstore knows which of the two it is talking to.

Object storage goes through obstore (Rust `object_store`): `s3://`, `gs://`, `az://` and its other schemes.
Credentials, region and endpoint come only from that library's standard environment (for S3:
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL, or an instance
role); an `http://` endpoint named there is allowed as given. Any other scheme is refused, never read as a
folder.
"""

from __future__ import annotations

import os
import re
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import zarr
import zarr.buffer
import zarr.storage

from featstore.errors import FeatstoreError, FeatstoreWarning, Name
from featstore.schema import Value
from featstore.store.locks import locked
from featstore.store.zarr_loop import sync

if TYPE_CHECKING:  # obstore is imported only for object-store URLs: a local store needs none of it
    from featstore.store.leases import Lease

OBJECT_SCHEMES = ("s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "adl", "http", "https")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_S3_ENDPOINTS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
LEASES = ".featstore"  # leases live under this prefix of the store; Zarr lists it as a foreign object
# zarr's LocalStore writes each file as <name>.<32 hex>.partial and renames it into place: one a kill left behind
# is no part of the store
_ZARR_TEMPORARY = re.compile(r"\.[0-9a-f]{32}\.partial$")


def zarr_temporary(name: str) -> bool:
    """True for a file zarr was still writing when its process died (local stores only)."""
    return _ZARR_TEMPORARY.search(name) is not None

warnings.filterwarnings("ignore", message=rf"Object at {re.escape(LEASES)} is not recognized")


class _Unlocked:
    """What a writer holds where no lease can be had: nothing to lose."""

    def check(self) -> None:
        pass


@dataclass(frozen=True)
class StoreLocation:
    """A `--store` value, parsed: `path` for a local folder, else `url` of an object-store prefix."""

    url: str
    path: Path | None = None

    @classmethod
    def parse(cls, text: str | Path | StoreLocation) -> StoreLocation:
        """Read a --store value; refuse a URL scheme featstore cannot reach (never a folder named 's3:')."""
        if isinstance(text, StoreLocation):
            return text
        if isinstance(text, Path):
            return cls(str(text), text)
        match = _SCHEME.match(text)
        if match is None:
            return cls(str(Path(text)), Path(text))
        scheme = match.group(1).lower()
        parts = urlsplit(text)
        if scheme == "file":
            if parts.netloc not in ("", "localhost") or not parts.path:
                raise FeatstoreError("a file:// URL names a local folder, file:///abs/path", field="store", value=text)
            return cls(str(Path(unquote(parts.path))), Path(unquote(parts.path)))
        if scheme not in OBJECT_SCHEMES:
            raise FeatstoreError(f"{scheme}:// is not a storage featstore can reach; use a local "
                                 f"path, file://, or one of {', '.join(s + '://' for s in OBJECT_SCHEMES)}",
                                 field="store", value=text)
        if not text[match.end():].startswith("//") or not parts.netloc:
            raise FeatstoreError(f"write an object-store URL as {scheme}://BUCKET/PREFIX", field="store", value=text)
        return cls(text.rstrip("/"))

    def __str__(self) -> str:
        return self.url

    @property
    def is_local(self) -> bool:
        return self.path is not None

    # -- the Zarr store and its objects -------------------------------------------------------------

    @cached_property
    def object_store(self):
        """The obstore store of this URL prefix (object storage only), configured from the environment."""
        import os

        from obstore.store import from_url

        options = {}
        scheme = self.url.split(":", 1)[0].lower()
        if scheme in ("s3", "s3a") and any(os.environ.get(v, "").startswith("http://") for v in _S3_ENDPOINTS):
            options["allow_http"] = True
        try:
            return from_url(self.url, client_options=options)
        except Exception as e:
            raise FeatstoreError(f"cannot reach it ({_brief(e)}); set the storage's standard "
                                 f"environment (for S3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, "
                                 f"AWS_ENDPOINT_URL)", field="store", value=self.url) from e

    def zarr_store(self, read_only: bool = False) -> zarr.abc.store.Store:
        if self.path is not None:
            return zarr.storage.LocalStore(self.path, read_only=read_only)
        return zarr.storage.ObjectStore(self.object_store, read_only=read_only)

    def has_store(self) -> bool:
        """True when a Zarr hierarchy starts here (its root zarr.json exists)."""
        if self.path is not None:
            return (self.path / "zarr.json").is_file()
        return self._remote(lambda: sync(self.zarr_store(read_only=True).exists("zarr.json")), "read")

    def check_usable(self) -> None:
        """A store location is new, empty, or a store: never a folder (or prefix) of other files."""
        if self.has_store():
            return
        if self.path is not None:
            if self.path.exists() and (not self.path.is_dir()
                                       or any(not zarr_temporary(p.name) for p in self.path.iterdir())):
                kind = "a folder with other files" if self.path.is_dir() else "a file"
                raise FeatstoreError(f"{self.path} is {kind}, not a featstore store (no zarr.json); point ",
                                     Name("store"), " "
                                     "at a new path or an existing store")
            return
        keys = self.keys("")
        if "zarr.json" in keys:  # another build made the store since has_store() looked: a store, not foreign
            return
        if any(not k.startswith(f"{LEASES}/") for k in keys):  # a lease is ours, not foreign
            raise FeatstoreError(f"{self.url} holds other objects, not a featstore store (no zarr.json); point ",
                                 Name("store"), " at a new prefix or an existing store")

    def create(self) -> None:
        """Make the folder of a new local store (object storage needs nothing)."""
        if self.path is not None:
            self.path.mkdir(parents=True, exist_ok=True)

    def keys(self, prefix: str) -> set[str]:
        """Every key under `prefix` (one listing, not a request per key)."""
        store = self.zarr_store(read_only=True)

        async def listing() -> set[str]:
            return {k async for k in store.list_prefix(prefix)}

        return self._remote(lambda: sync(listing()), "list")

    def last_written(self, prefix: str) -> float | None:
        """When anything under `prefix` was last written (seconds since the epoch; None: nothing there): file times
        on disk, the objects' last-modified times on object storage (one listing)."""
        if self.path is not None:
            times = [(Path(root) / f).stat().st_mtime for root, _, files in os.walk(self.path / prefix) for f in files]
            return max(times, default=None)
        import obstore

        def newest() -> float | None:
            stamps = [meta["last_modified"].timestamp() for batch in obstore.list(self.object_store, f"{prefix}/")
                      for meta in batch]
            return max(stamps, default=None)

        return self._remote(newest, "list")

    def check_writable(self, key: str) -> None:
        """Fail now, not after training, when nothing can be written under <key>/ (a read-only store)."""
        store = self.zarr_store()
        probe = f"{key}/.featstore-write-test-{uuid.uuid4().hex}"
        try:
            sync(store.set(probe, zarr.buffer.default_buffer_prototype().buffer.from_bytes(b"")))
            sync(store.delete(probe))
        except Exception as e:
            why = getattr(e, "strerror", None) or _brief(e)
            raise FeatstoreError(f"store {self} is read-only here ({why}: {self}/{key}); probes are saved into the "
                                 f"store: make it writable or copy it") from e

    # -- writers ------------------------------------------------------------------------------------

    @contextmanager
    def writer_lock(self, key: str | None, wait: bool, what: str) -> Iterator[Lease | _Unlocked]:
        """Exclusive right to write the store (`key` None: held briefly while groups are made) or one model's
        group (held for a whole build). The holder's `check()` raises once the right is lost."""
        if self.path is not None:
            with locked(self.path if key is None else self.path / key, wait, what):
                yield _Unlocked()
            return
        from featstore.store.leases import Lease, LeaseUnsupported

        lease = Lease(self.object_store, f"{LEASES}/{key or 'store'}.lease", what, self.url, wait)
        try:
            lease.acquire()
        except LeaseUnsupported as e:
            warnings.warn(f"{e}: nothing keeps a second build of this model out", FeatstoreWarning, stacklevel=3)
            yield _Unlocked()
            return
        try:
            yield lease
        finally:
            lease.release()

    def _remote(self, call, what: str):
        try:
            return call()
        except FeatstoreError:
            raise
        except Exception as e:
            if self.path is not None:
                raise
            raise FeatstoreError(f"cannot {what} it ({_brief(e)}); check the bucket and the "
                                 f"storage's standard environment (for S3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                                 f"AWS_REGION, AWS_ENDPOINT_URL)", field="store", value=self.url) from e


def _brief(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:200]


@dataclass(frozen=True)
class StoreLocationValue(Value):
    """A store location as `--store` takes it (a folder, file:// or an object-store URL: `StoreLocation.parse`),
    or "" for none."""

    default: Any = ""
    help: str = ""

    def describe(self) -> str:
        return "a store location (a folder, file:///path or an object-store URL), or empty"

    def check(self, value: Any) -> Any:
        if not isinstance(value, str):
            raise self.refuse(value)
        if value.strip():
            try:
                StoreLocation.parse(value)
            except FeatstoreError:
                raise self.refuse(value) from None
        return value
