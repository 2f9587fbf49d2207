"""nmt-serve under load: 400 requests from 32 concurrent clients vs the same requests one at a time.

    python benchmarks/serve.py [--path runs/ckpt/checkpoint_best.pt] [--path runs/ct2-int8] [--data runs/data]
        [--requests 400] [--clients 32]

For each --path: starts ``nmt-serve --path P --port 0`` (beam 5), sends the first N sentences of
test2016 (one sentence per request, LibreTranslate's shape) one at a time from one client, then all
of them again from 32 concurrent clients (one keep-alive connection each); prints requests/s, p50 and
p99 latency, failures, the ratio of the two rates, how many translations are identical to
``nmt-eval --path P`` on the same sentences, and that bad requests get 4xx while /health stays 200.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from nmt.data.corpus import ParallelCorpus
from nmt.data.text import resolve_text_file
from nmt.eval.translate import read_references


class Client:
    """One keep-alive HTTP connection, as a browser or a LibreTranslate client keeps one."""

    def __init__(self, url: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=300)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        return response.status, json.loads(response.read())


def translate_all(
    url: str, sentences: list[str], *, clients: int
) -> tuple[float, list[float], list[str | None]]:
    """(seconds, per-request latencies, translations or None for a failure), with ``clients`` in parallel."""
    local = threading.local()

    def one(sentence: str) -> tuple[float, str | None]:
        if not hasattr(local, "client"):
            local.client = Client(url)
        started = time.perf_counter()
        try:
            status, body = local.client.request(
                "POST",
                "/translate",
                json.dumps({"q": sentence, "source": "en", "target": "de"}).encode(),
            )
        except (OSError, http.client.HTTPException, ValueError):
            local.client = Client(url)
            return time.perf_counter() - started, None
        return time.perf_counter() - started, body.get("translatedText") if status == 200 else None

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(one, sentences))
    return (
        time.perf_counter() - started,
        [latency for latency, _ in results],
        [text for _, text in results],
    )


def bad_requests_answered(url: str) -> bool:
    """Bad requests get 4xx with a JSON error, and the service is healthy and translating afterwards."""
    client = Client(url)
    bad = [
        b"{not json",
        b'{"source": "en"}',
        b'{"q": 42}',
        json.dumps({"q": "x\n" * 10_000}).encode(),
        b"x" * (2 << 20),
    ]
    statuses = []
    for body in bad:
        try:
            status, reply = client.request("POST", "/translate", body)
            statuses.append(status if "error" in reply else 0)
        except (
            OSError,
            http.client.HTTPException,
        ):  # the server may close after refusing a huge body
            statuses.append(0)
        client = Client(url)
    healthy = (
        client.request("GET", "/health")[0] == 200
        and client.request("POST", "/translate", b'{"q": "A dog."}')[0] == 200
    )
    print(
        f"bad requests -> {statuses} (all 4xx: {all(400 <= s < 500 for s in statuses)}), healthy afterwards: {healthy}"
    )
    return all(400 <= s < 500 for s in statuses) and healthy


def nmt_eval(path: str, sentences: list[str], scratch: str) -> list[str]:
    source = os.path.join(scratch, "source.txt")
    output = os.path.join(scratch, "nmt-eval.txt")
    with open(source, "w", encoding="utf-8", newline="\n") as handle:
        handle.write("\n".join(sentences) + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "nmt_cli.eval",
            "--path",
            path,
            "--input",
            source,
            "--output",
            output,
            "--beam",
            "5",
        ],
        check=True,
        stderr=subprocess.DEVNULL,
    )
    with open(output, encoding="utf-8") as handle:
        return handle.read().split("\n")[:-1]


def start_server(path: str, log_path: str, extra: list[str]) -> tuple[subprocess.Popen, str]:
    log = open(log_path, "w", encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, "-m", "nmt_cli.serve", "--path", path, "--port", "0", *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 300
    while True:
        with open(log_path, encoding="utf-8") as handle:
            match = re.search(r"listening on (http://\S+)", handle.read())
        if match:
            return process, match.group(1)
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"nmt-serve did not start; see {log_path}")
        time.sleep(0.2)


def percentile_ms(latencies: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(latencies) * 1000, q))


def benchmark(path: str, sentences: list[str], args: argparse.Namespace, scratch: str) -> bool:
    expected = nmt_eval(path, sentences, scratch)
    log_path = os.path.join(scratch, f"serve-{os.path.basename(path.rstrip('/'))}.log")
    process, url = start_server(path, log_path, args.serve_args)
    try:
        print(f"\n{path}: nmt-serve {url}, {len(sentences)} requests of one sentence each, beam 5")
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        print(
            f"{'clients':>7}  {'seconds':>7}  {'req/s':>6}  {'p50 ms':>7}  {'p99 ms':>7}  {'failed':>6}  {'= nmt-eval':>10}"
        )
        rates = {}
        for clients in (1, args.clients):
            seconds, latencies, texts = translate_all(url, sentences, clients=clients)
            failed = sum(text is None for text in texts)
            same = sum(text == reference for text, reference in zip(texts, expected))
            rates[clients] = len(sentences) / seconds
            print(
                f"{clients:>7}  {seconds:>7.2f}  {rates[clients]:>6.1f}  {percentile_ms(latencies, 50):>7.0f}  "
                f"{percentile_ms(latencies, 99):>7.0f}  {failed:>6}  {100 * same / len(sentences):>9.1f}%"
            )
        print(
            f"{args.clients} concurrent clients vs one at a time: {rates[args.clients] / rates[1]:.2f}x the rate (target: 3x)"
        )
        ok = bad_requests_answered(url)
        with open(log_path, encoding="utf-8") as handle:
            batches = [
                int(n)
                for n in re.findall(r"batch \d+: \d+ requests, (\d+) sentences", handle.read())
            ]
        print(
            f"{len(batches)} decodes, {np.mean(batches):.1f} sentences each on average, at most {max(batches)}"
        )
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        return ok
    finally:
        process.terminate()
        process.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--path",
        action="append",
        help="checkpoint or exported directory (repeat; default runs/ckpt/checkpoint_best.pt)",
    )
    parser.add_argument(
        "--data",
        default="runs/data",
        help="preprocessed data whose test split's raw source is sent",
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument(
        "--serve-args",
        nargs=argparse.REMAINDER,
        default=[],
        help="passed to nmt-serve (last on the line)",
    )
    args = parser.parse_args()
    corpus = ParallelCorpus(args.data, args.split)
    if corpus.entry.input_prefix is None:
        parser.error(f"the manifest of {args.data} names no raw text for split {args.split!r}")
    sentences = read_references(
        resolve_text_file(corpus.entry.input_prefix, corpus.manifest.source_lang)
    )[: args.requests]
    with tempfile.TemporaryDirectory() as scratch:
        for path in args.path or ["runs/ckpt/checkpoint_best.pt"]:
            benchmark(path, sentences, args, scratch)


if __name__ == "__main__":
    main()
