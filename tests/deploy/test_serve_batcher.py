"""nmt-serve's request batcher alone (nmt.deploy.batcher): a fake translator records every decode,
so that the batches formed, the answers routed, failures and stopping are seen without a model or
a server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from nmt.config import EvalConfig
from nmt.deploy.batcher import DynamicBatcher
from nmt.eval.hypothesis import Hypothesis, LengthLimitError
from nmt.eval.translate import Translation
from nmt.languages import BILINGUAL, Direction

EOS = 2
TAGS = {7: "<2fr>"}


class FakeTranslator:
    """Translates a sentence into itself in capitals (a source tag included); ranks after the
    best end in " #rank". Each decode's sentences, forced first tokens and options are recorded;
    ``gate``, while cleared, holds a decode; "poison" breaks one; a sentence of more than
    ``max_tokens`` tokens (EOS included) is refused as the real check does."""

    config = EvalConfig()

    def __init__(self, *, max_tokens: int = 100) -> None:
        self.max_tokens = max_tokens
        self.words: dict[int, str] = dict(TAGS)
        self.decodes: list[tuple[list[str], list[int | None] | None, dict[str, Any]]] = []
        self.gate = threading.Event()
        self.gate.set()

    def _id(self, word: str) -> int:
        index = next((i for i, w in self.words.items() if w == word), 100 + len(self.words))
        self.words[index] = word
        return index

    def encode(self, sentences: list[str], *, direction: Direction) -> list[np.ndarray]:
        return list(
            direction.prefixed(
                [np.array([self._id(w) for w in s.split()] + [EOS]) for s in sentences]
            )
        )

    def check_sources(self, sources, config, *, truncate: bool) -> None:
        for index, source in enumerate(sources):
            if len(source) > self.max_tokens:
                raise LengthLimitError(index, f"{len(source)} tokens, over {self.max_tokens}")

    def text(self, tokens: list[int]) -> str:
        return " ".join(self.words[token] for token in tokens)

    def generate(self, sources, *, first_tokens, **options) -> list[list[Hypothesis]]:
        sentences = [self.text([int(t) for t in source[:-1]]) for source in sources]
        self.decodes.append((sentences, first_tokens, options))
        assert self.gate.wait(timeout=20)
        if "poison" in sentences:
            raise RuntimeError("this sentence breaks the decoder")
        nbest = options.get("nbest", 1)
        return [
            [Hypothesis([int(t) for t in source[:-1]], -float(rank)) for rank in range(nbest)]
            for source in sources
        ]

    def detokenize(self, hypotheses: list[list[Hypothesis]]) -> list[list[Translation]]:
        return [
            [
                Translation(
                    self.text(h.tokens).upper() + (f" #{int(-h.score)}" if h.score else ""),
                    h.score,
                    h.tokens,
                )
                for h in nbest
            ]
            for nbest in hypotheses
        ]

    @property
    def decoded(self) -> list[list[str]]:
        return [sentences for sentences, _, _ in self.decodes]


def run(
    scenario: Callable[[DynamicBatcher], Awaitable[Any]],
    translator: FakeTranslator,
    *,
    max_batch_tokens: int = 1000,
    max_wait_ms: float = 0.0,
) -> Any:
    """``scenario`` over a started batcher, stopped at the end; a hang fails within 30 s."""

    async def main() -> Any:
        batcher = DynamicBatcher(
            translator,  # type: ignore[arg-type]
            max_batch_tokens=max_batch_tokens,
            max_wait_ms=max_wait_ms,
        )
        batcher.start()
        try:
            return await asyncio.wait_for(scenario(batcher), 30)
        finally:
            translator.gate.set()
            await asyncio.wait_for(batcher.stop(), 30)

    return asyncio.run(main())


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)


def test_whole_requests_oldest_first_within_the_token_budget() -> None:
    fake = FakeTranslator()
    requests = [
        ["a b"],
        ["c", "d"],
        ["e f g h"],
        ["i"],
        ["j k l m n o p q r"],
    ]  # 3, 4, 5, 2, 10 tokens

    async def scenario(batcher: DynamicBatcher) -> tuple[list, float]:
        started = time.monotonic()
        answers = await asyncio.gather(*(batcher.translate(request) for request in requests))
        return answers, time.monotonic() - started

    answers, seconds = run(scenario, fake, max_batch_tokens=7, max_wait_ms=60_000)
    assert fake.decoded == [["a b", "c", "d"], ["e f g h", "i"], ["j k l m n o p q r"]]
    assert answers == [[[s.upper()] for s in request] for request in requests]
    assert seconds < 20  # a full budget does not wait for the batching window


def test_a_batch_waits_for_mates_until_the_window_closes() -> None:
    fake = FakeTranslator()

    async def scenario(batcher: DynamicBatcher) -> tuple[list, float]:
        started = time.monotonic()
        first = asyncio.ensure_future(batcher.translate(["a"]))
        await asyncio.sleep(0.05)
        second = await batcher.translate(["b"])
        return [await first, second], time.monotonic() - started

    answers, seconds = run(scenario, fake, max_wait_ms=400)
    assert answers == [[["A"]], [["B"]]] and fake.decoded == [["a", "b"]]
    assert seconds >= 0.4


def test_requests_arriving_during_a_decode_share_the_next_one() -> None:
    fake = FakeTranslator()
    fake.gate.clear()

    async def scenario(batcher: DynamicBatcher) -> list:
        first = asyncio.ensure_future(batcher.translate(["a"]))
        await until(lambda: len(fake.decodes) == 1)
        later = [asyncio.ensure_future(batcher.translate([word])) for word in ("b", "c", "d")]
        await until(lambda: batcher.queued_sentences == 3)
        fake.gate.set()
        return await asyncio.gather(first, *later)

    answers = run(scenario, fake)
    assert fake.decoded == [["a"], ["b", "c", "d"]]
    assert answers == [[["A"]], [["B"]], [["C"]], [["D"]]]


def test_each_request_gets_its_own_nbest_and_direction_from_a_shared_decode() -> None:
    fake = FakeTranslator()
    decoder_tag = Direction(first_token=9)
    encoder_tag = Direction(source_prefix=(7,))

    async def scenario(batcher: DynamicBatcher) -> list:
        return await asyncio.gather(
            batcher.translate(["a", "b"], direction=decoder_tag, nbest=3),
            batcher.translate(["c"], direction=BILINGUAL),
            batcher.translate(["d"], direction=encoder_tag, nbest=2),
        )

    answers = run(scenario, fake)
    assert len(fake.decodes) == 1
    sentences, first_tokens, options = fake.decodes[0]
    assert sentences == ["a", "b", "c", "<2fr> d"]
    assert first_tokens == [9, 9, None, None]
    assert options == {"nbest": 3, "beam": 5}
    assert answers == [
        [["A", "A #1", "A #2"], ["B", "B #1", "B #2"]],
        [["C"]],
        [["<2FR> D", "<2FR> D #1"]],
    ]


def test_a_failing_batch_fails_only_its_own_requests() -> None:
    fake = FakeTranslator()

    async def scenario(batcher: DynamicBatcher) -> tuple[list, list, int]:
        answers = await asyncio.gather(
            *(batcher.translate([text]) for text in ("a", "poison", "c")), return_exceptions=True
        )
        return answers, await batcher.translate(["d"]), batcher.num_batches

    (first, poisoned, third), after, num_batches = run(scenario, fake)
    assert fake.decoded == [["a", "poison", "c"], ["a"], ["poison"], ["c"], ["d"]]
    assert (first, third, after) == ([["A"]], [["C"]], [["D"]])
    assert isinstance(poisoned, RuntimeError)
    assert num_batches == 3  # a, c (each alone) and d: the failed decodes are no batches


def test_an_untranslatable_request_is_refused_before_it_joins_a_batch() -> None:
    fake = FakeTranslator(max_tokens=3)

    async def scenario(batcher: DynamicBatcher) -> list:
        with pytest.raises(LengthLimitError) as caught:
            await batcher.translate(["a", "b c d"])
        assert caught.value.index == 1 and batcher.queued_sentences == 0
        return await batcher.translate(["a b"])

    assert run(scenario, fake) == [["A B"]]
    assert fake.decoded == [["a b"]]


def test_stop_answers_the_queued_requests_at_once_and_drops_the_abandoned() -> None:
    fake = FakeTranslator()

    async def main() -> tuple[list, float]:
        batcher = DynamicBatcher(
            fake,  # type: ignore[arg-type]
            max_batch_tokens=1000,
            max_wait_ms=60_000,  # stopping must not wait for the batching window
        )
        batcher.start()
        queued = [asyncio.ensure_future(batcher.translate([word])) for word in ("a", "gone", "b")]
        await until(lambda: batcher.queued_sentences == 3)
        queued[1].cancel()  # its handler was cancelled: nobody waits for it
        started = time.monotonic()
        await asyncio.wait_for(batcher.stop(), 30)
        answers = await asyncio.wait_for(asyncio.gather(queued[0], queued[2]), 1)
        return answers, time.monotonic() - started

    answers, seconds = asyncio.run(main())
    assert answers == [[["A"]], [["B"]]]
    assert fake.decoded == [["a", "b"]]  # the abandoned request was not decoded
    assert seconds < 20


def test_stop_waits_for_the_decode_in_flight_and_then_ends_its_thread() -> None:
    fake = FakeTranslator()
    fake.gate.clear()

    async def main() -> tuple[list, bool]:
        batcher = DynamicBatcher(fake, max_batch_tokens=2, max_wait_ms=0)  # type: ignore[arg-type]
        batcher.start()
        requests = [asyncio.ensure_future(batcher.translate(["a"]))]
        await until(lambda: len(fake.decodes) == 1)
        requests.append(asyncio.ensure_future(batcher.translate(["b"])))
        await until(lambda: batcher.queued_sentences == 1)
        stopping = asyncio.ensure_future(batcher.stop())
        await asyncio.sleep(0.05)
        stopped_early = stopping.done()
        fake.gate.set()
        await asyncio.wait_for(stopping, 30)
        return await asyncio.wait_for(asyncio.gather(*requests), 1), stopped_early

    answers, stopped_early = asyncio.run(main())
    assert answers == [[["A"]], [["B"]]] and not stopped_early
    assert fake.decoded == [["a"], ["b"]]
    assert not any(thread.name.startswith("nmt-decode") for thread in threading.enumerate())
