"""Leases on object storage: the one-writer-per-model rule where there is no flock (docs/design.md §4).

A lease is one small JSON object created with a conditional write (S3/GCS/Azure put-if-absent, HTTP
`If-None-Match: *`), so exactly one of several racing creators gets it. It carries an expiry: its holder renews
it (a conditional replace, `If-Match` on the object's ETag) from a background thread every ttl/4 seconds, and a
lease whose expiry has passed belongs to a holder that died or lost the store; another build then takes it over
with the same conditional replace, so only one taker wins. A holder on this very machine that is no longer
running (same boot, its pid gone or reused) has died for sure, so its lease is taken over at once: a killed
build resumes without waiting for the expiry. Expiries are wall-clock times: the nodes' clocks must agree to
well within the ttl (NTP does).
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import obstore
from obstore.exceptions import AlreadyExistsError, NotFoundError, NotSupportedError, PreconditionError

from featstore.errors import FeatstoreError, Name

TTL_SECONDS = 60.0
POLL_SECONDS = 0.25
MAX_AHEAD_SECONDS = 600.0  # no holder writes an expiry further ahead than its ttl: one beyond this is garbage
# obstore 0.12 raises the builtin FileNotFoundError for a missing object where older versions raised NotFoundError
NOT_FOUND = (NotFoundError, FileNotFoundError)


class LeaseUnsupported(FeatstoreError):
    """The backend cannot do conditional writes, so it cannot hold a lease."""


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Holder:
    """Who holds a lease and until when: the lease object's content."""

    host: str
    pid: int
    boot: str
    start: int | None
    token: str
    expires: float

    @classmethod
    def me(cls, token: str, ttl: float) -> Holder:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, _boot_id(), _start_ticks(pid), token, time.time() + ttl)

    def encode(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Holder | None:
        try:
            d = json.loads(raw)
            return cls(str(d["host"]), int(d["pid"]), str(d["boot"]), d.get("start"), str(d["token"]),
                       float(d["expires"]))
        except (ValueError, KeyError, TypeError):
            return None  # not a lease of ours (or torn by hand): treated as expired

    def __str__(self) -> str:
        return f"pid {self.pid} on host {self.host}"

    def gone(self, now: float) -> bool:
        """Expired, or a process of this machine's current boot that no longer runs. An expiry that is not a finite
        time, or lies further ahead than any holder writes one (MAX_AHEAD_SECONDS), is garbage: such a lease would
        otherwise be waited on forever."""
        if not math.isfinite(self.expires) or now > self.expires or self.expires - now > MAX_AHEAD_SECONDS:
            return True
        same_boot = self.host == socket.gethostname() and self.boot and self.boot == _boot_id()
        return bool(same_boot and _start_ticks(self.pid) != self.start)


class Lease:
    """An exclusive lease on `key` of an obstore store, renewed in the background while held.

    Use as a context manager; `check()` raises once the lease has been lost (not renewed in time, or taken over),
    so a writer stops before it commits anything more."""

    def __init__(self, store, key: str, what: str, where: str, wait: bool, ttl: float = TTL_SECONDS):
        self.store, self.key, self.what, self.where, self.wait, self.ttl = store, key, what, where, wait, ttl
        self.holder: Holder | None = None
        self.etag: str | None = None
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- taking and giving back ---------------------------------------------------------------------

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _put(self, holder: Holder, mode) -> str:
        """Write the lease conditionally; a backend without conditional writes is LeaseUnsupported."""
        try:
            return obstore.put(self.store, self.key, holder.encode(), mode=mode)["e_tag"]
        except (NotSupportedError, NotImplementedError) as e:
            raise LeaseUnsupported(
                f"{self.where} cannot do conditional writes (put-if-absent, put-if-match), so featstore cannot keep "
                f"a second build of the same model out ({_brief(e)})") from e

    def acquire(self) -> None:
        token = uuid.uuid4().hex
        while True:
            mine = Holder.me(token, self.ttl)
            try:
                self.etag = self._put(mine, "create")
                self.holder = mine
                break
            except AlreadyExistsError:
                pass
            try:
                found = obstore.get(self.store, self.key)
                theirs, etag = Holder.decode(bytes(found.bytes())), found.meta["e_tag"]
            except NOT_FOUND:
                continue  # released meanwhile: try again
            if theirs is not None and theirs.token == token:  # our own create, retried by the client
                self.holder, self.etag = theirs, etag
                break
            if theirs is None or theirs.gone(time.time()):
                try:  # take it over; of several takers, only the first replace matches the old ETag
                    self.etag = self._put(mine, {"e_tag": etag})
                    self.holder = mine
                    break
                except (PreconditionError, *NOT_FOUND):
                    continue
            if not self.wait:
                left = max(0, round(theirs.expires - time.time()))
                raise FeatstoreError(
                    f"{self.what} is being written by {theirs} (its lease {self.where}/{self.key} runs "
                    f"{left} s more unless renewed); wait for that featstore command to finish (a rerun then resumes), "
                    f"or use another ", Name("store"))
            time.sleep(POLL_SECONDS)
        try:  # renew once now: a backend that can create but not replace conditionally cannot hold a lease
            self.etag = self._put(self.holder, {"e_tag": self.etag})
        except LeaseUnsupported:
            obstore.delete(self.store, self.key)
            raise
        self._thread = threading.Thread(target=self._renew, name="featstore-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and delete the lease, unless another holder has it by now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.lost is None and self.etag is not None:
            try:
                if obstore.head(self.store, self.key)["e_tag"] == self.etag:
                    obstore.delete(self.store, self.key)
            except NOT_FOUND:
                pass
        self.etag = None

    # -- holding ------------------------------------------------------------------------------------

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            assert self.holder is not None
            renewed = Holder(**{**self.holder.__dict__, "expires": time.time() + self.ttl})
            try:
                self.etag = obstore.put(self.store, self.key, renewed.encode(), mode={"e_tag": self.etag})["e_tag"]
                self.holder = renewed
            except PreconditionError:  # replaced since our last renewal: by another process, or by our own
                try:  # renewal that the server applied while its answer was lost (a retried request, an outage)
                    found = obstore.get(self.store, self.key)
                    theirs, etag = Holder.decode(bytes(found.bytes())), found.meta["e_tag"]
                except NOT_FOUND:
                    self.lost = "its object was deleted"
                    return
                except Exception:  # the store did not answer: try again, until the lease runs out
                    continue
                if theirs is not None and theirs.token == self.holder.token:
                    self.holder, self.etag = theirs, etag  # our own write: still ours
                    continue
                self.lost = "another process took it over"
                return
            except NOT_FOUND:
                self.lost = "its object was deleted"
                return
            except Exception as e:  # the store did not answer: try again, until the lease runs out
                if time.time() > self.holder.expires:
                    self.lost = f"it could not be renewed before it expired ({_brief(e)})"
                    return

    def check(self) -> None:
        """Raise if this process may no longer write under the lease (lost, or about to expire unrenewed)."""
        if self.lost is None and self.holder is not None and time.time() > self.holder.expires - self.ttl / 8:
            self.lost = "it was not renewed in time"
        if self.lost is not None:
            raise FeatstoreError(f"{self.what}: this build lost its lease {self.where}/{self.key} ({self.lost}); "
                                 f"nothing more was committed; rerun the command to resume")


def _brief(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:200]
