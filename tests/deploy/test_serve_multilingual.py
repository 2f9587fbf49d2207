"""nmt-serve with a multilingual model: LibreTranslate's source/target per request (directions mixed
in one decode), /languages, an untrained direction refused naming the directions, form bodies as
LibreTranslate's own clients post them, POST /detect and alternatives."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from _serve_helpers import get, post, serve

from nmt.eval import Translator

from ..helpers import MULTI_PAIRS

SENTENCES = ["the dog runs on the mat", "a big red ball"]


@pytest.fixture(scope="module")
def server(multi_models, tmp_path_factory):
    with serve(
        multi_models["decoder"], "--max-wait-ms", "50", log_dir=tmp_path_factory.mktemp("serve")
    ) as running:
        yield running


def post_form(url: str, fields: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url,
        data=urllib.parse.urlencode(fields, doseq=True).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_directions_of_one_batch_answered_as_the_translator_does(multi_models, server):
    translator = Translator.from_checkpoint(multi_models["decoder"])
    asks = [(pair.split("-"), SENTENCES) for pair in MULTI_PAIRS.split(",")[:1] + ["en-fr"]]
    with ThreadPoolExecutor(len(asks)) as pool:
        answers = list(
            pool.map(
                lambda ask: post(
                    server.url + "/translate",
                    {"q": ask[1], "source": ask[0][0], "target": ask[0][1]},
                ),
                asks,
            )
        )
    for ((source, target), sentences), (status, body) in zip(asks, answers):
        assert status == 200, body
        expected = translator.translate(sentences, source_lang=source, target_lang=target)
        assert body["translatedText"] == expected


def test_languages_lists_every_direction(server):
    status, body = get(server.url + "/languages")
    listing = {entry["code"]: entry["targets"] for entry in json.loads(body)}
    assert status == 200
    assert listing == {"de": ["en"], "en": ["de", "fr"], "fr": ["en"]}
    names = {entry["code"]: entry["name"] for entry in json.loads(body)}
    assert names == {"de": "German", "en": "English", "fr": "French"}


def test_untrained_direction_is_a_400_naming_the_directions(server):
    status, body = post(
        server.url + "/translate", {"q": "der hund", "source": "de", "target": "fr"}
    )
    assert status == 400
    assert "direction de-fr: not in the model (it has en-de, de-en, en-fr, fr-en" in body["error"]
    status, body = post(server.url + "/translate", {"q": "the dog", "source": "en"})
    assert status == 400 and body["error"].startswith("target: required")


def test_form_body_alternatives_and_detect(multi_models, server):
    status, body = post_form(
        server.url + "/translate",
        {"q": SENTENCES[0], "source": "en", "target": "de", "alternatives": "2"},
    )
    assert status == 200, body
    assert isinstance(body["translatedText"], str) and len(body["alternatives"]) == 2
    nbest = Translator.from_checkpoint(multi_models["decoder"]).translate_nbest(
        [SENTENCES[0]], source_lang="en", target_lang="de", beam=5, nbest=3
    )[0]
    assert [body["translatedText"], *body["alternatives"]] == [t.text for t in nbest]
    status, body = post(server.url + "/detect", {"q": "the dog runs on the mat"})
    assert status == 200 and list(body[0]) == ["confidence", "language"]
    assert body[0]["language"] in ("en", "de", "fr") and 0 <= body[0]["confidence"] <= 100
    status, body = post(
        server.url + "/translate", {"q": "the dog", "source": "auto", "target": "de"}
    )
    assert status == 200 and set(body["detectedLanguage"]) == {"confidence", "language"}
