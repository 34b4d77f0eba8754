"""Leases on a real S3 server (moto, started here): racing processes get exactly one lease, a hung holder's lease
expires and is taken over (and the holder learns it lost it), a killed holder's lease is taken over at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import obstore
import pytest

from featstore.errors import FeatstoreError
from featstore.store.leases import Lease
from featstore.store.location import StoreLocation

HOLD = r"""
import select, sys
from featstore.store.leases import Lease
from featstore.store.location import StoreLocation
from featstore.errors import FeatstoreError
url, ttl = sys.argv[1], float(sys.argv[2])
lease = Lease(StoreLocation.parse(url).object_store, "m.lease", "model 'm'", url, wait=False, ttl=ttl)
print("ready", flush=True)
sys.stdin.readline()  # go
try:
    lease.acquire()
except FeatstoreError as e:
    print("refused", e, flush=True)
    sys.exit(2)
print("won", flush=True)
try:  # held, checked every 0.05 s, until a line on stdin (or its end) says release
    while not select.select([sys.stdin], [], [], 0.05)[0]:
        lease.check()
except FeatstoreError as e:
    print("lost", e, flush=True)
    sys.exit(3)
lease.release()
"""


def holder(url: str, ttl: float) -> subprocess.Popen:
    """A process that takes the lease when it reads a line (`go`), holds it and releases it at the next line."""
    return subprocess.Popen([sys.executable, "-c", HOLD, url, str(ttl)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ})


def ready(proc: subprocess.Popen) -> None:
    """Wait until the holder is up."""
    assert proc.stdout.readline() == "ready\n", proc.stderr.read()


def go(proc: subprocess.Popen) -> None:
    """Tell the holder to take the lease."""
    proc.stdin.write("\n")
    proc.stdin.flush()


def test_racing_processes_get_exactly_one_lease(s3_url):
    """Four processes, each up and waiting, told to go at once; the winner holds its lease until the three others
    have answered (however slowly a busy machine runs them)."""
    procs = [holder(s3_url, 60) for _ in range(4)]
    for p in procs:
        ready(p)
    for p in procs:
        go(p)
    said = [p.stdout.readline() for p in procs]  # "won" or "refused ...", as each one's acquire ends
    winners = [p for p, line in zip(procs, said, strict=True) if line.startswith("won")]
    assert len(winners) == 1, said
    for p in procs:
        p.stdin.close()  # the winner releases
    outs = [(p.wait(timeout=120), line + p.stdout.read()) for p, line in zip(procs, said, strict=True)]
    assert sorted(code for code, _ in outs) == [0, 2, 2, 2], outs
    for code, out in outs:
        if code == 2:
            assert f"is being written by pid {winners[0].pid} on host" in out, out
    assert list(obstore.list(StoreLocation.parse(s3_url).object_store).collect()) == []  # released on exit


def test_a_hung_holder_loses_its_lease_when_it_expires(s3_url):
    """The refusal comes well inside the stopped holder's last renewal's ttl (renewed every ttl/4: 3 s of its 4 s
    left at least); the takeover is tried until it succeeds, the expiry's moment left to the lease."""
    store = StoreLocation.parse(s3_url).object_store
    first = holder(s3_url, ttl=4.0)
    ready(first)
    go(first)
    assert first.stdout.readline().startswith("won")
    first.send_signal(signal.SIGSTOP)  # alive, but renewing nothing: a hung or cut-off node
    try:
        with pytest.raises(FeatstoreError, match=f"is being written by pid {first.pid} on host"):
            Lease(store, "m.lease", "model 'm'", s3_url, wait=False, ttl=4.0).acquire()
        second = Lease(store, "m.lease", "model 'm'", s3_url, wait=False, ttl=30)
        deadline = time.monotonic() + 120  # a hang guard only
        while True:
            try:
                second.acquire()  # once the first one's lease has expired: taken over
                break
            except FeatstoreError:
                assert time.monotonic() < deadline, "the stopped holder's lease never expired"
                time.sleep(0.2)
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=120) == 3  # it finds its lease lost at its next check
    assert "lost its lease" in first.stdout.read()
    assert obstore.head(store, "m.lease")["e_tag"] == second.etag  # the first one did not delete it on its way out
    second.check()
    second.release()
    assert list(obstore.list(store).collect()) == []


def test_a_killed_holder_on_this_machine_is_taken_over_at_once(s3_url):
    store = StoreLocation.parse(s3_url).object_store
    first = holder(s3_url, ttl=600)
    ready(first)
    go(first)
    assert first.stdout.readline().startswith("won")
    first.kill()
    first.wait()
    t = time.monotonic()
    with Lease(store, "m.lease", "model 'm'", s3_url, wait=False) as lease:
        lease.check()
    assert time.monotonic() - t < 300  # not the 600 s of its expiry (a loose bound: the machine may be busy)


@pytest.mark.parametrize("text", ["foo://bucket/s.zarr", "s3:/bucket/s.zarr", "s3:bucket", "memory:///s",
                                  "file://otherhost/s.zarr"])
def test_unreachable_store_urls_are_refused(text):
    with pytest.raises(FeatstoreError, match="^store="):
        StoreLocation.parse(text)


def test_local_paths_and_file_urls_are_folders(tmp_path):
    assert StoreLocation.parse(str(tmp_path / "s.zarr")).path == tmp_path / "s.zarr"
    assert StoreLocation.parse(f"file://{tmp_path}/s.zarr").path == tmp_path / "s.zarr"
    assert StoreLocation.parse("s3://bucket/a/s.zarr/").path is None


def test_a_backend_without_conditional_replace_cannot_hold_a_lease(tmp_path):
    from obstore.store import LocalStore

    from featstore.store.leases import LeaseUnsupported

    store = LocalStore(tmp_path)  # obstore's local store can put-if-absent but not put-if-match
    with pytest.raises(LeaseUnsupported, match="cannot do conditional writes"):
        Lease(store, "m.lease", "model 'm'", str(tmp_path), wait=False).acquire()
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_a_build_that_lost_its_lease_commits_no_more_chunks(s3_url):
    import numpy as np
    from synthetic import class_clusters, write_feature_store

    from featstore.store.writer import ChunkData, StoreWriter

    feats, labels = class_clusters(64, 2, [8], seed=1)
    write_feature_store(s3_url, feats, labels, 2, chunk_rows=32)
    fs = StoreWriter(s3_url)
    fs.undo_chunks("synthetic", "clean", [1])
    lease = Lease(StoreLocation.parse(s3_url).object_store, "m.lease", "model 'm'", s3_url, wait=False, ttl=0.4)
    lease.acquire()
    obstore.delete(lease.store, lease.key)  # as if another build had taken it over: the next renewal fails
    time.sleep(0.5)
    fs.guard = lease.check
    with pytest.raises(FeatstoreError, match="lost its lease"):
        fs.commit_chunk("synthetic", "clean", ChunkData(1, [feats[0][32:]], np.zeros((32, 2), np.float16),
                                                       np.zeros(32, dtype=bool)))
    assert fs.done("synthetic", "clean").tolist() == [True, False]
    lease.release()


def test_a_build_paused_past_its_lease_writes_nothing_over_the_new_holder(s3_url):
    """A build paused past its lease's expiry, while another build took over and committed the
    chunk, PUT its arrays and checksum row over the new holder's when it resumed. Now it checks the deadline before
    each write: the new holder's chunk stays, and verify finds the store sound."""
    import numpy as np
    from synthetic import class_clusters, write_feature_store

    from featstore.store.writer import ChunkData, StoreWriter

    feats, labels = class_clusters(64, 2, [8, 4], seed=1)
    write_feature_store(s3_url, feats, labels, 2, chunk_rows=32)
    objects = StoreLocation.parse(s3_url).object_store
    stale, fresh = StoreWriter(s3_url), StoreWriter(s3_url)
    first = Lease(objects, ".featstore/synthetic.lease", "model 'm'", s3_url, wait=False, ttl=1.0)
    first.acquire()
    first._stop.set()  # paused: renewing nothing (SIGSTOP)
    first._thread.join()
    time.sleep(1.2)
    second = Lease(objects, ".featstore/synthetic.lease", "model 'm'", s3_url, wait=False, ttl=30)
    second.acquire()  # the first one's lease expired: taken over
    new = [f[:32] + 1.0 for f in feats]
    fresh.guard = second.check
    fresh.commit_chunk("synthetic", "clean", ChunkData(0, new, np.ones((32, 2), np.float16), np.zeros(32, bool)))
    stale.guard = first.check  # it resumes with its own (other) values of the same chunk
    with pytest.raises(FeatstoreError, match="lost its lease"):
        stale.commit_chunk("synthetic", "clean", ChunkData(0, [f[:32] - 5.0 for f in feats],
                                                           np.zeros((32, 2), np.float16), np.zeros(32, bool)))
    for a, name in enumerate(("anchor00", "anchor01")):
        np.testing.assert_array_equal(fresh.read("synthetic", "clean", name, slice(0, 32)),
                                      new[a].astype(np.float16))
    np.testing.assert_array_equal(fresh.read_logits("synthetic", "clean", slice(0, 32)), np.ones((32, 2)))
    assert fresh.verify() == []  # the checksum row is the new holder's too
    second.release()


@pytest.mark.parametrize("expires", ["NaN", "Infinity", "4102444800.0"])
def test_a_lease_with_an_expiry_no_holder_writes_is_taken_over(s3_url, expires):
    """A lease whose expiry is NaN, Infinity or in 2100 (a holder on another host) was waited on
    forever; it is garbage, taken over at once."""
    import json
    import socket

    store = StoreLocation.parse(s3_url).object_store
    garbage = {"host": "elsewhere", "pid": 1, "boot": "x", "start": None, "token": "t"}
    raw = json.dumps(garbage)[:-1] + f', "expires": {expires}}}'
    obstore.put(store, "m.lease", raw.encode())
    t = time.monotonic()
    with Lease(store, "m.lease", "model 'm'", s3_url, wait=True) as lease:
        lease.check()
        assert json.loads(bytes(obstore.get(store, "m.lease").bytes()))["host"] == socket.gethostname()
    assert time.monotonic() - t < 300  # not waited on forever (a loose bound: the machine may be busy)


def test_a_lease_object_deleted_during_a_build_is_a_lost_lease(s3_url):
    """obstore 0.12 raises FileNotFoundError for the renewal of a deleted lease, which no `except NotFoundError`
    matched: the build committed every chunk. Now it is a lost lease, said in one line."""
    store = StoreLocation.parse(s3_url).object_store
    lease = Lease(store, "m.lease", "model 'm'", s3_url, wait=False, ttl=0.4)
    lease.acquire()
    obstore.delete(store, "m.lease")
    time.sleep(0.6)
    with pytest.raises(FeatstoreError, match="lost its lease"):
        lease.check()
    lease.release()


def test_a_renewal_the_server_applied_while_its_answer_was_lost_keeps_the_lease(s3_url):
    """After an S3 outage the holder's own buffered renewal had succeeded at the server, so its next
    If-Match failed and the build said "another process took it over". A lease that still carries this holder's
    token is its own: it keeps it (another process's token still loses it)."""
    import json

    store = StoreLocation.parse(s3_url).object_store
    lease = Lease(store, "m.lease", "model 'm'", s3_url, wait=False, ttl=2.0)
    lease.acquire()
    own = {**lease.holder.__dict__, "expires": time.time() + 2.0}
    obstore.put(store, "m.lease", json.dumps(own, sort_keys=True).encode())  # our renewal, its answer lost: new ETag
    # a renewal after it: the lease's ETag the server's again (lost, the wait ends too: check() raises it)
    until(lambda: lease.lost is not None or (lease.holder.expires > own["expires"]
                                             and obstore.head(store, "m.lease")["e_tag"] == lease.etag))
    lease.check()
    other = {**own, "token": "someone-else", "expires": time.time() + 2.0}
    obstore.put(store, "m.lease", json.dumps(other, sort_keys=True).encode())
    until(lambda: lease.lost is not None)  # its next renewal finds the other token
    with pytest.raises(FeatstoreError, match="another process took it over"):
        lease.check()
    lease.release()


def until(done, guard: float = 120) -> None:
    """Wait for `done()`, the lease's renewals being on their own thread; the guard is a hang guard only."""
    deadline = time.monotonic() + guard
    while not done():
        assert time.monotonic() < deadline, "not within the hang guard"
        time.sleep(0.05)


def test_a_lease_object_deleted_before_release_is_released_quietly(s3_url):
    """obstore 0.12's head of a deleted object raises FileNotFoundError: a build whose lease object was deleted
    committed every chunk, then exited 1 with a traceback from its release."""
    store = StoreLocation.parse(s3_url).object_store
    lease = Lease(store, "m.lease", "model 'm'", s3_url, wait=False, ttl=60)
    lease.acquire()
    obstore.delete(store, "m.lease")
    lease.release()
    assert list(obstore.list(store).collect()) == []
