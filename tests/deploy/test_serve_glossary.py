"""Glossaries in nmt-serve: request and named glossaries, 400s naming the bad entry, the terms
applied reported, 32 concurrent clients mixing glossaries (none leaks), plain clients unchanged."""

from __future__ import annotations

import itertools
import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from _serve_helpers import get, post, serve

from nmt.data.terminology import Glossary
from nmt.deploy.protocol import (
    MAX_GLOSSARY_ENTRIES,
    MAX_TERM_CHARS,
    RequestError,
    parse_request,
    translation_response,
)
from nmt.eval import Translator

TERMS = "der die hund katze rennt sitzt auf matte rot blau".split()  # pieces the tiny model knows


def _parse(payload, **named):
    return parse_request(json.dumps(payload).encode(), max_sentences=8, glossaries=named)


def test_a_request_carries_a_glossary_or_names_one() -> None:
    pets = Glossary({"dog": "Hund"}, name="pets.tsv")
    asked = _parse({"q": "a dog", "glossary": {"dog": "Köter"}, "glossary_mode": "constrain"})
    assert asked.glossary.entries == {"dog": "Köter"} and asked.glossary_mode == "constrain"
    assert _parse({"q": "a dog", "glossary": "pets"}, pets=pets).glossary is pets
    plain = _parse({"q": "a dog"})
    assert plain.glossary is None and plain.glossary_mode == "annotate"
    # a form (LibreTranslate's clients) names a glossary
    form = parse_request(
        b"q=a+dog&glossary=pets",
        max_sentences=8,
        content_type="application/x-www-form-urlencoded",
        glossaries={"pets": pets},
    )
    assert form.glossary is pets


@pytest.mark.parametrize(
    "glossary, message",
    [
        ({"": "Hund"}, "glossary entry '': empty source term"),
        ({"dog": "  "}, "glossary entry 'dog': empty target term"),
        ({" dog": "Hund"}, "glossary entry ' dog': source term ' dog' begins or ends with a space"),
        (
            {"dog": "x" * (MAX_TERM_CHARS + 1)},
            f"glossary entry 'dog': a term of {MAX_TERM_CHARS + 1}",
        ),
        ({"dog": 3}, "glossary entry 'dog': the target term must be a string"),
        (
            {f"w{i}": "x" for i in range(MAX_GLOSSARY_ENTRIES + 1)},
            f"glossary: {MAX_GLOSSARY_ENTRIES + 1} entries, at most {MAX_GLOSSARY_ENTRIES}",
        ),
        ("cats", "glossary: no glossary named 'cats' (loaded: pets)"),
        (["dog", "Hund"], "glossary: must be an object"),
    ],
)
def test_a_bad_glossary_is_a_400_naming_the_entry(glossary, message) -> None:
    with pytest.raises(RequestError) as caught:
        _parse({"q": "a dog", "glossary": glossary}, pets=Glossary({"dog": "Hund"}))
    assert caught.value.status == 400 and "\n" not in caught.value.message
    assert caught.value.message.startswith(message)


def test_a_bad_glossary_mode_is_a_400() -> None:
    with pytest.raises(
        RequestError, match="glossary_mode: must be one of annotate, constrain, both"
    ):
        _parse({"q": "a", "glossary": {"a": "b"}, "glossary_mode": "soft"})


def test_applied_terms_are_answered_per_text() -> None:
    asked = _parse(
        {"q": ["a dog\nthe dog cat", "red"], "glossary": {"dog": "Hund", "cat": "Katze"}}
    )
    terms = [asked.glossary.matches(sentence) for sentence in asked.sentences]
    body = translation_response(asked, [["x"], ["y"], ["z"]], terms=terms)
    assert body["appliedTerms"] == [
        [{"source": "dog", "target": "Hund"}, {"source": "cat", "target": "Katze"}],
        [],
    ]
    single = _parse({"q": "a dog", "glossary": {"dog": "Hund"}})
    assert translation_response(single, [["x"]], terms=[[("dog", "Hund")]])["appliedTerms"] == [
        {"source": "dog", "target": "Hund"}
    ]
    assert "appliedTerms" not in translation_response(_parse({"q": "a"}), [["x"]])


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    """A torch-backed server holding one named glossary."""
    root = tmp_path_factory.mktemp("glossary-serve")
    (root / "pets.tsv").write_text("dog\thundhund\n", encoding="utf-8")
    with serve(
        tiny.checkpoint,
        "--glossary",
        f"pets={root / 'pets.tsv'}",
        "--max-wait-ms",
        "50",
        log_dir=root,
    ) as running:
        yield running


def test_32_concurrent_clients_mixing_glossaries_none_leaks(tiny, server) -> None:
    """Each client's glossary maps a word of its sentence to a target term no other client has;
    with hard constraints the term must be in its own output, and no client's term is in
    another's. Clients without a glossary get what they get alone."""
    sentences = [s for s in tiny.test_src if "dog" not in s.split()]
    markers = ["".join(pair) for pair in itertools.permutations(TERMS, 2)][:32]
    assert not any(a != b and a in b for a in markers for b in markers)
    requests = []
    for i in range(32):
        sentence = sentences[i % len(sentences)]
        kind = ("plain", "constrain", "both", "annotate")[i % 4]
        payload = {"q": sentence, "source": "en", "target": "de"}
        if kind != "plain":
            payload |= {"glossary": {sentence.split()[0]: markers[i]}, "glossary_mode": kind}
        requests.append((kind, sentence, payload))
    plain = Translator.from_checkpoint(tiny.checkpoint).translate(sentences, beam=5)
    alone = dict(zip(sentences, plain))
    with ThreadPoolExecutor(32) as clients:
        answers = list(
            clients.map(lambda r: post(server.url + "/translate", r[2]), requests, timeout=300)
        )
    batch_sizes = re.findall(r"batch \d+: (\d+) requests", server.log())
    assert max(map(int, batch_sizes)) > 1, "glossary requests shared decodes"
    for i, ((kind, sentence, _), (status, body)) in enumerate(zip(requests, answers)):
        assert status == 200, body
        output = body["translatedText"]
        others = [m for j, m in enumerate(markers) if j != i]
        assert not any(marker in output for marker in others), (i, output)
        if kind == "plain":
            assert output == alone[sentence] and "appliedTerms" not in body
            continue
        assert body["appliedTerms"] == [{"source": sentence.split()[0], "target": markers[i]}]
        if kind in ("constrain", "both"):
            assert markers[i] in output


def test_a_named_glossary_applies_where_its_term_occurs(server) -> None:
    status, body = post(
        server.url + "/translate",
        {"q": ["a dog", "a cat"], "glossary": "pets", "glossary_mode": "constrain"},
    )
    assert status == 200
    assert body["appliedTerms"] == [[{"source": "dog", "target": "hundhund"}], []]
    assert "hundhund" in body["translatedText"][0] and "hundhund" not in body["translatedText"][1]
    status, body = post(server.url + "/translate", {"q": "a dog", "glossary": "cats"})
    assert status == 400 and body["error"].startswith("glossary: no glossary named 'cats'")
    assert get(server.url + "/health")[0] == 200


def test_ctranslate2_serving_annotates_and_refuses_constraints(tiny, exported, tmp_path) -> None:
    with serve(exported, log_dir=tmp_path) as running:
        status, body = post(
            running.url + "/translate",
            {"q": "a dog", "glossary": {"dog": "hund"}, "glossary_mode": "constrain"},
        )
        assert status == 400 and "\n" not in body["error"]
        assert body["error"].startswith("glossary_mode constrain: ")
        assert "CTranslate2" in body["error"]
        status, body = post(running.url + "/translate", {"q": "a dog", "glossary": {"dog": "hund"}})
        assert status == 200 and body["appliedTerms"] == [{"source": "dog", "target": "hund"}]


def test_named_glossary_errors_at_start_are_one_line(tiny, tmp_path, capsys) -> None:
    from nmt_cli.serve import main

    bad = tmp_path / "bad.tsv"
    bad.write_text("dog\tHund\ncat\n", encoding="utf-8")
    for spec, message in (
        (f"pets={bad}", f"{bad}:2: expected 'source term<TAB>target term'"),
        ("pets", "--glossary: expected NAME=FILE, got 'pets'"),
        (f"pets={tmp_path / 'none.tsv'}", str(tmp_path / "none.tsv")),
    ):
        assert main(["--path", tiny.checkpoint, "--port", "0", "--glossary", spec]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("nmt-serve: error: ") and message in err and "\n" not in err
