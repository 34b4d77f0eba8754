"""A real S3-compatible server for tests and benchmarks: moto's server mode (PyPI `moto[server]`), started in its
own process on a free loopback port, reached by featstore through the standard AWS_* environment only.

moto answers S3's conditional writes (PUT with If-None-Match: * and If-Match: <etag>, HTTP 412 when they fail),
which the build lease relies on. Its own check and write are two steps in Python, so two such PUTs on one key
arriving within microseconds could both pass; `--serial-writes` (the default here) makes the server handle one
write at a time, as S3 itself decides each conditional write atomically.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_SERVER = r"""
import sys, threading
from werkzeug.serving import make_server
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app

app = DomainDispatcherApplication(create_backend_app)
writes = threading.Lock()

def serial_writes(environ, start_response):
    if environ["REQUEST_METHOD"] in ("PUT", "POST", "DELETE"):
        with writes:
            return list(app(environ, start_response))
    return app(environ, start_response)

server = make_server("127.0.0.1", 0, serial_writes, threaded=True, request_handler=MotoRequestHandler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@dataclass(frozen=True)
class S3Server:
    """Where the server listens and the environment that points a client at it."""

    endpoint: str
    env: dict[str, str]

    def create_bucket(self, name: str) -> str:
        """Create a bucket (with boto3, moto's own client) and return its s3:// URL."""
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name=self.env["AWS_REGION"],
                     aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=name)
        return f"s3://{name}"


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """Start moto's S3 server on 127.0.0.1 (a free port), yield it, stop it."""
    proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        port = int(proc.stdout.readline())
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300  # a hang guard: moto starts in seconds, more on a busy machine
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the moto S3 server did not start") from None
                time.sleep(0.1)
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": endpoint}
        yield S3Server(endpoint, env)
    finally:
        proc.kill()
        proc.wait()


def with_env(env: dict[str, str]) -> dict[str, str]:
    """os.environ plus `env`: for subprocesses that must find the server."""
    return {**os.environ, **env}
