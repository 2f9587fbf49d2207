"""nmt-serve as a child process, and HTTP helpers over loopback (stdlib only: the client is not under test)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: str

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8") as handle:
            return handle.read()


def post(url: str, body: bytes | dict, *, timeout: float = 60.0) -> tuple[int, dict]:
    """POST JSON (or raw bytes); (status, parsed JSON body) for 2xx and 4xx/5xx alike."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def get(url: str, *, timeout: float = 30.0) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read()


@contextlib.contextmanager
def serve(path: str, *args: str, log_dir: pathlib.Path) -> Iterator[Server]:
    """``nmt-serve --path PATH --port 0 ARGS`` as a child process; stopped (SIGTERM) at the end."""
    log_path = str(log_dir / f"serve-{time.monotonic_ns()}.log")
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nmt_cli.serve",
                "--path",
                path,
                "--port",
                "0",
                "--threads",
                "1",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = Server(url="", process=process, log_path=log_path)
    try:
        deadline = time.monotonic() + 120
        while not (match := re.search(r"listening on (http://\S+)", server.log())):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"nmt-serve did not start:\n{server.log()}")
            time.sleep(0.1)
        server.url = match.group(1)
        yield server
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def chromium_binaries() -> tuple[str, str] | None:
    """(chromium, chromedriver) from Debian's packages, if installed."""
    chromium = next(
        (p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if os.path.exists(p)), None
    )
    driver = next(
        (
            p
            for p in ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
            if os.path.exists(p)
        ),
        None,
    )
    return (chromium, driver) if chromium and driver else None
