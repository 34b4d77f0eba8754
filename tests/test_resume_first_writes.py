"""A build SIGKILLed at any moment of its first seconds resumes: killed right after each moment class of its first
object writes, from the first to its first chunk's commit, and run again, each store ends bit-identical to an
uninterrupted build (every array, every node's attributes), on the S3 test server and on a local folder.

The moment classes are the phases a build writes in, in order: the root group, the image table (its arrays, then its
attributes, which say it is finished), the model's group, its head, the view's group and the declaration of its
arrays, the first chunk's data and its done mark (and on S3 the lease's first object: its renewals fall anywhere; a
later rewrite of an earlier phase's object is no phase of its own). Each phase is killed in three states: right
after its first write (begun, nothing of it finished), its middle one (some of its objects there, left by the killed
build, the rest not) and its last (whole, the next not begun). Other moments inside a phase leave the middle one's
state with more or fewer of its objects, so these cover every state a resume can meet (a killed build's objects to
overwrite among them), where an even spread of 20 tried some phases several times and others' middle never.

The moments are counted exactly. On S3 a proxy between the build and the server (moto) counts the build's writes
(PUT, POST, DELETE) on the wire and, once the server has applied the Nth, SIGKILLs the build before it hears the
answer. On a local folder the build process counts zarr's file writes and SIGKILLs itself after the Nth (that
hook is the tests', in the forked child, never in featstore). Each build is a real process: forked from one that
has imported featstore and torch once (conftest's ForkedCLI), so that 31 killed builds and their 31 resumes fit
in CI."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import obstore
import pytest
import zarr
from obstore.store import S3Store
from synthetic import make_image_folder

from conftest import ForkedCLI, run_cli

PHASES = {"root", "images", "model", "head", "view", "chunk", "done"}  # each build's, on S3 "lease" too
# a noise view (its attrs decide its draws) and two anchors: few arrays, so that a build makes few requests
BUILD = ["build", "--model", "resnet18", "--weights", "none", "--image-size", "32", "--chunk-rows", "8",
         "--batch-size", "8", "--workers", "0", "--device", "cpu", "--no-progress", "--views", "gaussian_noise-1",
         "--anchors", "layer1.0,layer4.1",
         "--threads", "1"]  # other thread counts differ in the last bits (docs/build.md#reliability)

def killed(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def exited_ok(status: int) -> bool:
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a killed build's connections reset: expected


class KillingProxy:
    """An HTTP proxy in front of the S3 server that counts the writes it forwards (PUT, POST, DELETE) and SIGKILLs
    the build `pid` once the server has applied its `kill_after`-th write, before the build hears the answer;
    nothing that build sends after that reaches the server. `writes` lists what the server applied, in order."""

    def __init__(self, upstream: str):
        self.upstream = urlsplit(upstream)
        self.writes: list[str] = []
        self.kill_after, self.pid, self.dead = 0, 0, False
        self.pid_known = threading.Event()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.server = _QuietServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def arm(self, kill_after: int) -> None:
        with self.lock:
            self.writes, self.kill_after, self.pid, self.dead = [], kill_after, 0, False
            self.pid_known.clear()

    def started(self, pid: int) -> None:
        self.pid = pid
        self.pid_known.set()

    def settle(self) -> None:
        """Wait until no request of the killed build is still being forwarded."""
        while True:
            with self.lock:
                if self.in_flight == 0:
                    return
            time.sleep(0.01)

    def _forward(self, method: str, path: str, headers: dict, body: bytes | None) -> tuple | None:
        self.pid_known.wait()
        with self.lock:
            if self.dead:
                return None
            self.in_flight += 1
        try:
            conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
            conn.request(method, path, body=body, headers=headers)
            answer = conn.getresponse()
            reply = (answer.status, answer.reason, answer.getheaders(), answer.read())
            conn.close()
            if method in ("PUT", "POST", "DELETE") and answer.status < 300:
                with self.lock:
                    self.writes.append(f"{method} {path}")
                    if len(self.writes) == self.kill_after and not self.dead:
                        self.dead = True
                        os.kill(self.pid, signal.SIGKILL)
                    if self.dead:
                        return None
            return reply
        finally:
            with self.lock:
                self.in_flight -= 1

    def _handler(self) -> type:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def handle_one(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                reply = proxy._forward(self.command, self.path, headers, body)
                if reply is None:  # the build is dead: no answer
                    self.close_connection = True
                    return
                status, reason, answer_headers, data = reply
                head = [f"HTTP/1.1 {status} {reason}"]
                head += [f"{k}: {v}" for k, v in answer_headers
                         if k.lower() not in ("transfer-encoding", "connection", "content-length")]
                head.append(f"Content-Length: {len(data)}")
                payload = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
                self.wfile.write(payload + (b"" if self.command == "HEAD" else data))  # one write: no Nagle wait

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

        return Handler

    def close(self) -> None:
        self.server.shutdown()


def s3_objects(url: str) -> S3Store:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return S3Store(bucket, prefix=prefix, endpoint=os.environ["AWS_ENDPOINT_URL"], client_options={"allow_http": True})


def contents(store: str | Path) -> dict[str, tuple]:
    """Every node of a store, read with plain zarr: each group's attributes, each array's attributes, dtype and
    values (as bytes)."""
    where = store if isinstance(store, Path) else zarr.storage.ObjectStore(s3_objects(store), read_only=True)
    root = zarr.open_group(where, mode="r")
    out: dict[str, tuple] = {"": ("group", json.dumps(dict(root.attrs), sort_keys=True))}
    for name, node in root.members(max_depth=None):
        attrs = json.dumps(dict(node.attrs), sort_keys=True)
        if isinstance(node, zarr.Array):
            values = np.asarray(node[:])
            out[name] = ("array", attrs, str(values.dtype), values.shape, values.tobytes())
        else:
            out[name] = ("group", attrs)
    return out


def differences(got: dict[str, tuple], want: dict[str, tuple]) -> list[str]:
    out = [f"{name}: missing" for name in sorted(set(want) - set(got))]
    out += [f"{name}: not in the uninterrupted build" for name in sorted(set(got) - set(want))]
    out += [f"{name}: differs" for name in sorted(set(want) & set(got)) if got[name] != want[name]]
    return out


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """16 images: two chunks of 8."""
    return make_image_folder(tmp_path_factory.mktemp("first-writes"), n_classes=2, per_class=8, size=(40, 32), seed=4)


@pytest.fixture(scope="module")
def builds(forked_cli: ForkedCLI) -> ForkedCLI:
    return forked_cli


@pytest.fixture(scope="module")
def reference(images, builds, tmp_path_factory) -> dict[str, tuple]:
    """An uninterrupted build on local disk: what every store here must equal."""
    store = tmp_path_factory.mktemp("reference") / "s.zarr"
    status, out = builds.run([*BUILD, "--data", images, "--store", store])
    assert exited_ok(status), out
    return contents(store)


def unfinished_image_table(store: Path) -> bool:
    """Whether a local store's image table is there without the attrs a build writes last (read as plain JSON)."""
    meta = store / "images" / "zarr.json"
    return meta.is_file() and "fingerprint" not in json.loads(meta.read_text()).get("attributes", {})


def phase(write: str) -> str:
    """Which phase of a build a write belongs to, from its path in the store (a file path or "PUT /bucket/...")."""
    inside = write.split(".zarr/", 1)[-1].split("?", 1)[0]
    parts = inside.split("/")
    if parts[0] == ".featstore":
        return "lease"
    if parts == ["zarr.json"]:
        return "root"
    if parts[0] == "images":
        return "images"
    if len(parts) == 2:
        return "model"
    if parts[1] == "head":
        return "head"
    if "/done/c/" in inside:
        return "done"
    return "chunk" if "/c/" in inside else "view"


def moments(writes: list[str]) -> list[int]:
    """The write counts to kill after: the first, the middle and the last write of each run of one phase, up to the
    first chunk's commit (the module's docstring says why these cover every moment)."""
    phases = [phase(w) for w in writes[:first_commit(writes)]]
    assert PHASES <= set(phases), f"a phase is missing from the build's first writes: {sorted(set(phases))}"
    # the lease's renewals fall between any two writes and leave one state (a lease held): its first write stands
    # for them; they and a rewrite of an earlier phase's object (on S3 the model group's attrs, as views are
    # added) split no phase
    steps: list[tuple[int, str]] = []
    for i, p in enumerate(phases):
        if p != "lease" and not (steps and p != steps[-1][1] and p in {q for _, q in steps}):
            steps.append((i, p))
    starts = [k for k in range(len(steps)) if k == 0 or steps[k - 1][1] != steps[k][1]]
    edges = {steps[k][0] for a, b in zip(starts, [*starts[1:], len(steps)], strict=True) for k in (a, (a + b - 1) // 2,
                                                                                                   b - 1)}
    leases = [i for i, p in enumerate(phases) if p == "lease"]
    print("the first writes' phases:", " ".join(f"{i + 1}:{p}" for i, p in enumerate(phases)))
    return sorted(i + 1 for i in edges | set(leases[:1]))


def first_commit(writes: list[str]) -> int:
    """How many writes a build made up to and including its first chunk's commit (a `done` chunk object)."""
    return next(i + 1 for i, w in enumerate(writes) if "/done/c/" in w)


def resumes(builds: ForkedCLI, images: Path, store: str | Path, reference: dict, kill: Callable[[], int],
            moment: int) -> str | None:
    """None when the build killed at `moment` (by `kill()`, which returns its wait status) resumes to the
    reference; else what went wrong."""
    status = kill()
    if not killed(status):
        return f"moment {moment}: the build was not killed (wait status {status})"
    status, out = builds.run([*BUILD, "--data", images, "--store", store])
    if not exited_ok(status):
        return f"moment {moment}: the rerun failed: {out.strip()[-600:]}"
    diff = differences(contents(store), reference)
    return f"moment {moment}: {', '.join(diff[:5])}" if diff else None


def test_a_build_killed_after_any_of_its_first_writes_on_s3_resumes_bit_identical(s3, s3_url, images, builds,
                                                                                  reference):
    proxy = KillingProxy(s3.endpoint)
    try:
        through_proxy = {"AWS_ENDPOINT_URL": proxy.endpoint}
        proxy.arm(0)  # an uninterrupted build through the proxy: its writes, counted
        status, out = builds.run([*BUILD, "--data", images, "--store", f"{s3_url}/whole.zarr"], env=through_proxy,
                                 started=proxy.started)
        assert exited_ok(status), out
        assert not differences(contents(f"{s3_url}/whole.zarr"), reference)
        kill_moments = moments(proxy.writes)
        print(f"kill after writes {kill_moments}")
        failures = []
        for n in kill_moments:
            store = f"{s3_url}/killed-{n}.zarr"
            proxy.arm(n)

            def kill(store: str = store, n: int = n) -> int:
                status = builds.run([*BUILD, "--data", images, "--store", store], env=through_proxy,
                                    started=proxy.started)[0]
                proxy.settle()
                return status

            failures.append(resumes(builds, images, store, reference, kill, n))
            leases = [m["path"] for batch in obstore.list(s3_objects(store), ".featstore/") for m in batch]
            if leases:
                failures.append(f"moment {n}: leases left behind: {leases}")
    finally:
        proxy.close()
    failures = [f for f in failures if f]
    assert not failures, f"{len(failures)} of {len(kill_moments)} moments:\n" + "\n".join(failures)


def test_a_build_killed_after_any_of_its_first_writes_on_a_local_folder_resumes_bit_identical(images, builds,
                                                                                              reference, tmp_path):
    trace = tmp_path / "writes.txt"  # an uninterrupted build's file writes, in order
    status, out = builds.run([*BUILD, "--data", images, "--store", tmp_path / "whole.zarr"], trace=trace)
    assert exited_ok(status), out
    kill_moments = moments(trace.read_text().splitlines())
    print(f"kill after writes {kill_moments}")
    failures = []
    for n in kill_moments:
        store = tmp_path / f"killed-{n}.zarr"

        def kill(store: Path = store, n: int = n) -> int:
            status = builds.run([*BUILD, "--data", images, "--store", store], kill_after=n)[0]
            # before the rerun, as nothing builds it: verify names an unfinished image table, and only that
            said = run_cli("verify", store, ok=False).output
            if ("images: not finished" in said) != unfinished_image_table(store):
                failures.append(f"moment {n}: verify said {said.strip()[:300]!r}")
            return status

        failures.append(resumes(builds, images, store, reference, kill, n))
    failures = [f for f in failures if f]
    assert not failures, f"{len(failures)} of {len(kill_moments)} moments:\n" + "\n".join(failures)
