"""nmt-serve against clumsy and hostile clients over loopback (issue 28, cases 3, 4, 5 and 8; issue 27's
413): a bad request fails alone, parsing is bounded, slow or idle connections are closed, their
number is bounded, SIGTERM is bounded, start-up mistakes are one line."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _serve_helpers import get, post, serve

from nmt.config import EvalConfig
from nmt.deploy.serve import DynamicBatcher
from nmt.eval import Translator
from nmt.eval.hypothesis import Hypothesis
from nmt.eval.translate import Translation

LONG = "the big red dog sits on the mat"


@pytest.fixture(scope="module")
def strict(tiny, tmp_path_factory):
    """One server for the module (a start costs seconds): --min-len 14, so that a one-word sentence
    (12 tokens at most) cannot be translated; a long batching window, so that concurrent requests
    share decodes; short timeouts and few connections, so that each limit shows in a second or two.
    The tests that hold connections come last: the others must not meet their 503s."""
    with serve(
        tiny.checkpoint,
        "--min-len",
        "14",
        "--max-wait-ms",
        "300",
        "--header-timeout",
        "2",
        "--keep-alive-timeout",
        "1",
        "--body-timeout",
        "2",
        "--max-connections",
        "40",
        log_dir=tmp_path_factory.mktemp("strict"),
    ) as running:
        yield running


def test_a_request_that_cannot_be_translated_fails_alone(tiny, strict) -> None:
    expected = Translator.from_checkpoint(tiny.checkpoint).translate(LONG, min_len=14)
    texts = ["dog" if i % 4 == 0 else LONG for i in range(32)]
    with ThreadPoolExecutor(32) as clients:
        answers = list(clients.map(lambda q: post(strict.url + "/translate", {"q": q}), texts))
    for text, (status, body) in zip(texts, answers):
        if text == "dog":
            assert status == 400
            assert body["error"].startswith("q: --min-len 14 is more than the 12 tokens"), body
        else:
            assert (status, body) == (200, {"translatedText": expected})
    sizes = [int(n) for n in re.findall(r"batch \d+: (\d+) requests", strict.log())]
    assert max(sizes) > 1  # the valid ones still share decodes
    # Where in a list of texts the failing line is.
    status, body = post(strict.url + "/translate", {"q": [LONG, LONG + "\ndog"]})
    assert status == 400 and body["error"].startswith("q[1] line 2: --min-len 14"), body


@pytest.mark.parametrize(
    "body, message",
    [
        (b'{"q": "a dog \\ud800 runs"}', "q: character 7 is a lone surrogate (U+D800)"),
        (b'{"q": ["a dog", "\\udfff"]}', "q[1]: character 1 is a lone surrogate (U+DFFF)"),
        (b'{"q": ' + b"[" * 5000 + b"]" * 5000 + b"}", "invalid JSON: nested too deeply"),
        (b"[" * 100_000, "invalid JSON: nested too deeply"),
        (b'{"q": "a", "n": ' + b"1" * 5000 + b"}", "invalid JSON: Exceeds the limit"),
        (
            json.dumps({"q": "the dog " * 6250}).encode(),  # 50,000 characters, one sentence
            "q: 12500 pieces long, over the 1023 this model reads; split it",
        ),
        (
            json.dumps({"q": [LONG, LONG + "\n" + "a " * 2000]}).encode(),
            "q[1] line 2: 2000 pieces long, over the 1023",
        ),
    ],
)
def test_unparsable_or_untranslatable_text_is_a_400_not_a_500(strict, body, message) -> None:
    status, answer = post(strict.url + "/translate", body)
    assert status == 400 and answer["error"].startswith(message), answer
    assert "Traceback" not in strict.log()


def test_a_body_far_over_the_limit_sent_whole_reads_its_413(strict) -> None:
    """Issue 27: urllib sends the whole 20 MB before it reads; it used to get a connection reset."""
    request = urllib.request.Request(
        strict.url + "/translate", data=b"x" * 20_000_000, headers={"Content-Type": "text/plain"}
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    assert caught.value.code == 413
    assert "over the limit of 1048576" in json.loads(caught.value.read())["error"]
    assert get(strict.url + "/health")[0] == 200


def test_a_failed_decode_is_retried_alone_so_its_batch_mates_succeed() -> None:
    """The batcher's last line of defence, for a failure no check foresaw."""

    class FailsOnPoison:
        config = EvalConfig()

        def encode(self, sentences, *, direction):
            return [np.array([3 + len(s), 2]) for s in sentences]

        def check_sources(self, sources, config, *, truncate):
            pass

        def generate(self, sources, *, first_tokens):
            if any(int(source[0]) == 3 + len("poison") for source in sources):
                raise RuntimeError("this sentence breaks the decoder")
            return [[Hypothesis(tokens=[int(source[0])], score=0.0)] for source in sources]

        def detokenize(self, hypotheses):
            return [[Translation(str(h.tokens[0]), h.score, h.tokens)] for (h,) in hypotheses]

    async def scenario():
        batcher = DynamicBatcher(FailsOnPoison(), max_batch_tokens=1000, max_wait_ms=50)
        batcher.start()
        try:
            return await asyncio.gather(
                *(batcher.translate([text]) for text in ("a", "poison", "abc")),
                return_exceptions=True,
            ), batcher.num_batches
        finally:
            await batcher.stop()

    (first, poisoned, third), num_batches = asyncio.run(scenario())
    assert first == [["4"]] and third == [["6"]]
    assert isinstance(poisoned, RuntimeError)
    assert num_batches == 2  # the two good ones, each alone after the shared batch failed


def _connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)))
    client.settimeout(20)
    return client


def _read_until_closed(client: socket.socket) -> tuple[float, bytes]:
    """Seconds until the server closed the connection, and what it sent."""
    started, data = time.monotonic(), b""
    with client:
        while chunk := client.recv(65536):
            data += chunk
    return time.monotonic() - started, data


HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def test_idle_and_slow_connections_are_closed(strict) -> None:
    silent = _connect(strict)  # sends nothing
    dripping = _connect(strict)  # a byte of its head now and then
    for byte in HEALTH[:4]:
        dripping.sendall(bytes([byte]))
        time.sleep(0.3)
    waited, data = _read_until_closed(silent)
    assert data == b"" and waited < 5
    assert _read_until_closed(dripping)[1] == b""
    # After a response, an idle keep-alive connection goes too.
    kept = _connect(strict)
    kept.sendall(HEALTH)
    waited, data = _read_until_closed(kept)
    assert data.startswith(b"HTTP/1.1 200 OK") and waited < 5
    # A body that stops half-way is answered 408, and the connection closed.
    half = _connect(strict)
    half.sendall(
        b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"q": "a'
    )
    waited, data = _read_until_closed(half)
    assert data.startswith(b"HTTP/1.1 408 ") and b"--body-timeout" in data and waited < 5
    # A request head that grows past h11's bound without ending is refused, not buffered.
    huge = _connect(strict)
    huge.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 40_000)
    assert _read_until_closed(huge)[1].startswith(b"HTTP/1.1 400 ")


def test_open_connections_are_bounded_and_the_service_recovers(strict) -> None:
    idle = [_connect(strict) for _ in range(44)]  # 40 held (less any still closing), the rest 503
    time.sleep(0.5)
    refused = _connect(strict)
    refused.sendall(HEALTH)
    _, data = _read_until_closed(refused)
    assert data.startswith(b"HTTP/1.1 503 ") and b"--max-connections 40" in data
    answers = [_read_until_closed(client)[1] for client in idle]
    held = sum(answer == b"" for answer in answers)  # closed idle by --header-timeout
    assert (
        held <= 40 and sum(answer.startswith(b"HTTP/1.1 503 ") for answer in answers) == 44 - held
    )
    assert get(strict.url + "/health")[0] == 200
    assert "Traceback" not in strict.log()


@pytest.mark.slow
def test_sigterm_with_a_half_sent_body_exits_within_the_grace_period(tiny, tmp_path) -> None:
    with serve(
        tiny.checkpoint, "--shutdown-timeout", "1", "--body-timeout", "600", log_dir=tmp_path
    ) as running:
        half = _connect(running)
        half.sendall(
            b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"q": "a'
        )
        time.sleep(0.5)
        running.process.send_signal(signal.SIGTERM)
        _, data = _read_until_closed(half)
        assert running.process.wait(timeout=30) == 0, running.log()
    assert data.startswith(b"HTTP/1.1 503 ") and b"shutting down" in data
    assert "Traceback" not in running.log()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--port", "99999"], "--port: must be in [0, 65535] (0: any free port), got 99999"),
        (["--port", "0", "--threads", "-1"], "--threads: must be >= 0 (0: one per core), got -1"),
        (["--port", "0", "--min-len", "100"], "--min-len 100: no translation may be that long"),
        (["--port", "0", "--header-timeout", "0"], "--header-timeout: must be > 0, got 0"),
    ],
)
def test_startup_mistakes_are_one_line(tiny, exported, capsys, argv, message) -> None:
    from nmt_cli.serve import main

    for path in (tiny.checkpoint, exported):
        assert main(["--path", path, *argv]) == 1
        err = capsys.readouterr().err.strip()
        assert err == f"nmt-serve: error: {message}" or (
            err.startswith(f"nmt-serve: error: {message}") and len(err.splitlines()) == 1
        ), err
