"""nmt-serve over loopback: concurrent clients batched together, bad requests, SIGTERM, both backends."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from _serve_helpers import get, post, serve

from nmt.deploy.serve import RequestError, ServeConfig, Service, parse_request
from nmt.eval import Translator
from nmt.languages import Languages


def _parse(body: bytes, **limits):
    asked = parse_request(body, **{"max_sentences": 4, **limits})
    Service(Languages.one_direction("en", "de")).direction(
        None if asked.source == "auto" else asked.source, asked.target
    )
    return asked.lines, asked.is_list


def test_parse_request_shapes_and_one_line_errors() -> None:
    assert _parse(b'{"q": "a dog\\nthe cat", "source": "en", "target": "de"}') == (
        [["a dog", "the cat"]],
        False,
    )
    assert _parse(b'{"q": ["a", ""], "source": "auto"}') == ([["a"], [""]], True)
    assert _parse('{"q": "a\u2028b\\r"}'.encode()) == ([["a\u2028b\r"]], False)  # "\n" only splits
    form = b"q=a+dog%0Athe+cat&source=en&target=de&alternatives=2"
    asked = parse_request(form, max_sentences=4, content_type="application/x-www-form-urlencoded")
    assert (asked.lines, asked.source, asked.target, asked.alternatives) == (
        [["a dog", "the cat"]],
        "en",
        "de",
        2,
    )
    for body, message in (
        (b"{not json", "invalid JSON"),
        (b"\xff\xfe", "invalid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"text": "a"}', "missing q"),
        (b'{"q": 3}', "q: must be a string or a list of strings"),
        (b'{"q": ["a", null]}', "q: must be a string or a list of strings"),
        (b'{"q": "a", "target": "fr"}', "direction en-fr: not in the model (it has en-de)"),
        (b'{"q": "a", "source": 1}', "source: must be a string"),
        (b'{"q": ["a", "b\\nc\\nd", "e"]}', "too many sentences: 5"),
        (b'{"q": "a", "format": "html"}', "format: only 'text' is served"),
        (b'{"q": "a", "alternatives": 99}', "alternatives: must be an integer from 0 to 8"),
    ):
        with pytest.raises(RequestError, match=re.escape(message)) as caught:
            _parse(body)
        assert caught.value.status == 400 and "\n" not in caught.value.message
    with pytest.raises(ValueError, match="--max-wait-ms"):
        ServeConfig(max_wait_ms=-1)


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    """A torch-backed server with small limits, so that over-limit requests are cheap to make."""
    with serve(
        tiny.checkpoint,
        "--max-request-sentences",
        "40",
        "--max-body-bytes",
        "4096",
        "--max-wait-ms",
        "20",
        log_dir=tmp_path_factory.mktemp("serve"),
    ) as running:
        yield running


def test_concurrent_clients_are_batched_and_answered_as_the_translator_does(tiny, server) -> None:
    expected = dict(
        zip(
            tiny.test_src,
            Translator.from_checkpoint(tiny.checkpoint).translate(tiny.test_src, beam=5),
        )
    )
    requests = [tiny.test_src[i % len(tiny.test_src)] for i in range(96)]
    _, before = get(server.url + "/health")
    with ThreadPoolExecutor(16) as clients:
        answers = list(
            clients.map(
                lambda q: post(server.url + "/translate", {"q": q, "source": "en", "target": "de"}),
                requests,
            )
        )
    assert [status for status, _ in answers] == [200] * len(requests)
    assert [body["translatedText"] for _, body in answers] == [expected[q] for q in requests]
    status, health = get(server.url + "/health")
    num_batches = json.loads(health)["batches"] - json.loads(before)["batches"]
    assert status == 200 and num_batches < len(requests) / 2  # requests were decoded together
    batch_lines = re.findall(
        r"batch \d+: (\d+) requests, (\d+) sentences, \d+ source tokens -> \d+ target tokens, [\d.]+ ms",
        server.log(),
    )
    assert max(int(num_requests) for num_requests, _ in batch_lines) > 1
    # A list of texts, each of several lines, comes back in the same shape.
    status, body = post(
        server.url + "/translate",
        {"q": [tiny.test_src[0] + "\n" + tiny.test_src[1], "", tiny.test_src[2]]},
    )
    assert status == 200
    assert body["translatedText"] == [
        expected[tiny.test_src[0]] + "\n" + expected[tiny.test_src[1]],
        "",
        expected[tiny.test_src[2]],
    ]


@pytest.mark.parametrize(
    "body, status, message",
    [
        (b'{"q": "a dog", ', 400, "invalid JSON"),
        (b'{"source": "en", "target": "de"}', 400, "missing q"),
        (b'{"q": {"text": "a dog"}}', 400, "q: must be a string"),
        (json.dumps({"q": "dog\n" * 41}).encode(), 400, "too many sentences"),
        (json.dumps({"q": "a dog " * 1000}).encode(), 413, "over the limit of 4096"),
        (
            b'{"q": "a dog", "target": "fr"}',
            400,
            "direction en-fr: not in the model (it has en-de)",
        ),
    ],
)
def test_bad_requests_get_4xx_json_and_the_service_stays_up(
    tiny, server, body, status, message
) -> None:
    got_status, got = post(server.url + "/translate", body)
    assert got_status == status and message in got["error"]
    assert get(server.url + "/health")[0] == 200
    assert post(server.url + "/translate", {"q": tiny.test_src[0]})[0] == 200


def test_unknown_routes_and_methods_answer_json(server) -> None:
    import urllib.error
    import urllib.request

    for request, code in (
        (urllib.request.Request(server.url + "/nope"), 404),
        (urllib.request.Request(server.url + "/translate"), 405),
    ):
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=30)
        assert caught.value.code == code and "error" in json.loads(caught.value.read())
    status, page = get(server.url + "/")
    assert status == 200 and b'id="translate"' in page and b"en \xe2\x86\x92 de" in page


def test_sigterm_answers_requests_in_flight_then_exits_0(tiny, tmp_path) -> None:
    expected = Translator.from_checkpoint(tiny.checkpoint).translate(tiny.test_src[:6], beam=5)
    # A long batching window holds the requests in the queue when SIGTERM arrives.
    with serve(tiny.checkpoint, "--max-wait-ms", "3000", log_dir=tmp_path) as running:
        answers: list = [None] * 6

        def ask(index: int) -> None:
            answers[index] = post(running.url + "/translate", {"q": tiny.test_src[index]})

        clients = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
        for client in clients:
            client.start()
        deadline = time.monotonic() + 30
        while json.loads(get(running.url + "/health")[1])["queued_sentences"] < 6:
            assert time.monotonic() < deadline, running.log()
            time.sleep(0.05)
        running.process.send_signal(signal.SIGTERM)
        for client in clients:
            client.join(timeout=60)
        assert running.process.wait(timeout=60) == 0, running.log()
    assert [answer[0] for answer in answers] == [200] * 6
    assert [answer[1]["translatedText"] for answer in answers] == expected
    assert "Shutting down" in running.log() and "Traceback" not in running.log()


def test_serves_an_exported_directory_through_ctranslate2(tiny, exported, tmp_path) -> None:
    expected = Translator.from_checkpoint(exported).translate(tiny.test_src, beam=5)
    with serve(exported, log_dir=tmp_path) as running:
        assert json.loads(get(running.url + "/health")[1])["backend"] == "ctranslate2"
        with ThreadPoolExecutor(8) as clients:
            answers = list(
                clients.map(lambda q: post(running.url + "/translate", {"q": [q]}), tiny.test_src)
            )
    assert [body["translatedText"] for _, body in answers] == [[text] for text in expected]


def test_startup_errors_are_one_line(tiny, tmp_path, capsys) -> None:
    from nmt_cli.serve import main

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        assert main(["--path", tiny.checkpoint, "--port", port]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"nmt-serve: error: --host/--port: cannot listen on 127.0.0.1:{port} (Address already in use"
    )
    for argv, message in (
        (["--path", str(tmp_path / "none.pt"), "--port", "0"], "no such checkpoint file"),
        (["--path", str(tmp_path), "--port", "0"], "not one written by nmt-export"),
        (
            ["--path", tiny.checkpoint, "--port", "0", "--max-wait-ms", "-1"],
            "--max-wait-ms: must be >= 0",
        ),
    ):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert (
            err.startswith("nmt-serve: error:") and message in err and len(err.splitlines()) == 1
        ), err
