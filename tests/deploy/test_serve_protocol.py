"""nmt-serve's protocol alone (nmt.deploy.protocol): LibreTranslate's bodies parsed, checked and
answered as plain calls, without a server or a model."""

from __future__ import annotations

import json

import pytest

from nmt.deploy.protocol import (
    RequestError,
    Service,
    TranslateRequest,
    detection_response,
    detection_texts,
    locate,
    parse_request,
    translation_response,
    untranslatable,
)
from nmt.eval.hypothesis import LengthLimitError
from nmt.languages import BILINGUAL, Direction, Languages

FORM = "application/x-www-form-urlencoded"
MULTI = Languages(
    pairs=("en-de", "de-en", "en-fr"),
    tags={"<2de>": 5, "<2en>": 6, "<2fr>": 7},
    placement="encoder",
)


def parse(payload: dict | bytes, **options) -> TranslateRequest:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return parse_request(body, **{"max_sentences": 8, **options})


def refusal(call, *args, **kwargs) -> RequestError:
    with pytest.raises(RequestError) as caught:
        call(*args, **kwargs)
    assert "\n" not in caught.value.message
    return caught.value


def test_a_request_is_parsed_into_its_texts_lines_and_options() -> None:
    asked = parse({"q": ["a dog\nthe cat", ""], "source": "en", "target": "de", "alternatives": 2})
    assert asked == TranslateRequest(
        [["a dog", "the cat"], [""]], True, source="en", target="de", alternatives=2
    )
    assert asked.sentences == ["a dog", "the cat", ""]
    # Empty source/target mean "not given"; "\r" and U+2028 are not line breaks.
    assert parse({"q": "a\u2028b\r", "source": "", "target": ""}) == TranslateRequest(
        [["a\u2028b\r"]], False
    )
    # A form, as LibreTranslate's clients post it: numbers are strings, a repeated key a list.
    form = parse(b"q=a+dog&q=the+cat&alternatives=1&source=auto", content_type=FORM + "; x=y")
    assert (form.lines, form.is_list, form.alternatives, form.source) == (
        [["a dog"], ["the cat"]],
        True,
        1,
        "auto",
    )


@pytest.mark.parametrize(
    "body, content_type, message",
    [
        (b"{not json", "application/json", "invalid JSON: Expecting property name"),
        (b"[" * 100_000, "application/json", "invalid JSON: nested too deeply"),
        (b'"q"', "application/json", "the body must be a JSON object"),
        (b"q=\xff", FORM, "invalid form: not UTF-8"),
        (b'{"text": "a"}', "application/json", "missing q"),
        (b'{"q": ["a", 1]}', "application/json", "q: must be a string or a list of strings"),
        (b'{"q": ["a", "\\udfff"]}', "application/json", "q[1]: character 1 is a lone surrogate"),
        (b'{"q": "a", "target": 2}', "application/json", "target: must be a string"),
        (b'{"q": "a", "format": "html"}', "application/json", "format: only 'text' is served"),
        (b'{"q": "a", "alternatives": true}', "application/json", "alternatives: must be an"),
        (b"q=a&alternatives=-1", FORM, "alternatives: must be an integer from 0 to 8, got '-1'"),
        (b'{"q": ["a\\nb\\nc", "d\\ne\\nf\\ng\\nh\\ni"]}', "application/json", "too many"),
    ],
)
def test_each_mistake_is_a_400_with_one_line(body, content_type, message) -> None:
    error = refusal(parse_request, body, max_sentences=8, content_type=content_type)
    assert error.status == 400 and error.message.startswith(message), error.message
    assert not error.close  # the body was read whole: the connection can carry another request


def test_the_sentence_limit_counts_lines_and_names_its_option() -> None:
    assert parse({"q": ["a\nb", "c"]}, max_sentences=3).sentences == ["a", "b", "c"]
    error = refusal(parse, {"q": ["a\nb", "c\nd"]}, max_sentences=3)
    assert error.message == (
        "too many sentences: 4 in one request, at most 3 (--max-request-sentences)"
    )


def test_a_bilingual_service_takes_its_own_direction_or_none() -> None:
    service = Service(Languages.one_direction("en", "de"))
    assert service.direction(None, None) is BILINGUAL
    assert service.direction("en", "de") is BILINGUAL
    assert service.direction("en", None) is BILINGUAL
    assert not service.detects(parse({"q": "a", "source": "auto"}))
    for source, target in (("en", "fr"), ("de", "en")):
        error = refusal(service.direction, source, target)
        assert (error.status, error.message) == (
            400,
            f"direction {source}-{target}: not in the model (it has en-de)",
        )
    # --zero-shot asks nothing of an untagged model: it has no tag to ask another direction with.
    assert refusal(Service(service.languages, zero_shot=True).direction, "de", "en").status == 400
    assert service.first_pair == ("en", "de")
    assert (service.source_lang, service.target_lang) == ("en", "de")
    assert service.listing() == [
        {"code": "de", "name": "German", "targets": []},
        {"code": "en", "name": "English", "targets": ["de"]},
    ]


def test_a_multilingual_service_takes_its_directions_and_zero_shot_only_when_allowed() -> None:
    service = Service(MULTI)
    assert service.direction("de", "en") == Direction(source_prefix=(6,))
    assert service.detects(parse({"q": "a", "source": "auto", "target": "de"}))
    assert service.first_pair == ("en", "de")
    assert refusal(service.direction, "en", None).message == (
        "target: required by this multilingual service (directions: en-de, de-en, en-fr)"
    )
    untrained = refusal(service.direction, "de", "fr").message
    assert untrained.startswith("direction de-fr: not in the model (it has en-de, de-en, en-fr")
    assert "need nmt-serve --zero-shot" in untrained  # the option as the server names it
    assert Service(MULTI, zero_shot=True).direction("de", "fr") == Direction(source_prefix=(7,))
    listing = {entry["code"]: entry["targets"] for entry in service.listing()}
    assert listing == {"de": ["en"], "en": ["de", "fr"], "fr": []}
    zero_shot = Service(MULTI, zero_shot=True).listing()
    assert {entry["code"]: entry["targets"] for entry in zero_shot}["de"] == ["en", "fr"]


def test_the_answer_has_the_request_shape() -> None:
    asked = parse({"q": "a\nb"})
    assert translation_response(asked, [["A"], ["B"]]) == {"translatedText": "A\nB"}
    # A list, alternatives (a sentence with fewer than asked repeats its last), the detected source.
    asked = parse({"q": ["a\nb", "c"], "alternatives": 2})
    answer = translation_response(
        asked, [["A1", "A2", "A3"], ["B1"], ["C1", "C2", "C3"]], detected=("en", 97.5)
    )
    assert answer == {
        "translatedText": ["A1\nB1", "C1"],
        "alternatives": [["A2\nB1", "A3\nB1"], ["C2", "C3"]],
        "detectedLanguage": [{"confidence": 97.5, "language": "en"}] * 2,
    }
    single = translation_response(parse({"q": "a", "alternatives": 1}), [["A1", "A2"]])
    assert single == {"translatedText": "A1", "alternatives": ["A2"]}


def test_detection_answers_per_text() -> None:
    asked = parse({"q": ["a\nb", "c"]})
    assert detection_texts(asked) == ["a\nb", "c"]
    found = [("en", 90.0), ("de", 80.5)]
    assert detection_response(asked, found) == [
        [{"confidence": 90.0, "language": "en"}],
        [{"confidence": 80.5, "language": "de"}],
    ]
    assert detection_response(parse({"q": "a"}), found[:1]) == [
        {"confidence": 90.0, "language": "en"}
    ]


def test_an_untranslatable_sentence_is_named_where_the_client_wrote_it() -> None:
    lines = [["a"], ["b", "c", "d"]]
    assert [locate(lines, index, is_list=True) for index in range(4)] == [
        "q[0]",
        "q[1] line 1",
        "q[1] line 2",
        "q[1] line 3",
    ]
    assert locate([["a", "b"]], 1, is_list=False) == "q line 2"
    with pytest.raises(IndexError):
        locate(lines, 4, is_list=True)
    error = untranslatable(parse({"q": ["a", "b\nc"]}), LengthLimitError(2, "too long"))
    assert (error.status, error.message, error.close) == (400, "q[1] line 2: too long", False)
