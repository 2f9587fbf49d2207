"""nmt-serve's request batcher: concurrent requests decoded together, one decode at a time.

Requests meet in one queue; a single task takes from it a batch of whole requests (oldest first, up
to a source-token budget, waiting at most a few milliseconds after the oldest arrived, and not at
all while a decode is running: requests pile up meanwhile) and hands it to one decode on a worker
thread, so the event loop keeps accepting and answering while the model runs. Each request gets its
own sentences' translations back. A sentence that cannot be translated as asked is refused before it
joins a batch; a decode that fails anyway is retried request by request, so that it fails only its
own. Stopping answers every request still waiting, then ends the task and the thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from nmt.eval.translate import Translator
from nmt.languages import BILINGUAL, Direction

logger = logging.getLogger(__name__)


@dataclass
class _Job:
    """One request's sentences on their way through the queue."""

    sources: list[np.ndarray]  # piece ids + EOS, one per sentence (a source tag first)
    num_tokens: int
    arrived: float  # event-loop time
    future: asyncio.Future[list[list[str]]]
    first_token: int | None = None  # a decoder-side target tag, forced
    nbest: int = 1
    # Per sentence, its glossary's terms as lexical constraints (target pieces); None: none asked.
    constraints: list[list[list[int]]] | None = None


class DynamicBatcher:
    """Gathers concurrent requests into one decode at a time (see the module docstring)."""

    def __init__(
        self, translator: Translator, *, max_batch_tokens: int, max_wait_ms: float
    ) -> None:
        self.translator = translator
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_ms / 1000.0
        self.num_batches = 0
        self._jobs: deque[_Job] = deque()
        self._queued_tokens = 0
        self._arrived = asyncio.Event()
        self._stopping = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmt-decode")
        self._task: asyncio.Task[None] | None = None

    @property
    def queued_sentences(self) -> int:
        return sum(len(job.sources) for job in self._jobs)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="nmt-batcher")

    async def stop(self) -> None:
        """Answer every request already queued (at once: no more waiting for batch-mates), then
        end the batching task and the decode thread."""
        self._stopping = True
        self._arrived.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    async def translate(
        self,
        sentences: list[str],
        *,
        direction: Direction = BILINGUAL,
        nbest: int = 1,
        terms: list[list[tuple[str, str]]] | None = None,
        glossary_mode: str = "annotate",
    ) -> list[list[str]]:
        """The ``nbest`` best translations of each of ``sentences`` (in order), decoded together
        with whatever else is queued (other directions of a multilingual model included).

        A sentence that cannot be translated as asked (longer than the model reads, or under a
        length limit shorter than --min-len) raises ``LengthLimitError`` before it joins a batch.
        ``terms``: per sentence, its glossary terms, applied in ``glossary_mode``
        (``Translator.apply_terms``) to this request's sentences only.
        """
        assert not self._stopping, "a request after the batcher was stopped"
        loop = asyncio.get_running_loop()
        sources = self.translator.encode(sentences, direction=direction)
        constraints = None
        if terms is not None:
            sources, constraints = self.translator.apply_terms(sources, terms, mode=glossary_mode)
        self.translator.check_sources(sources, self.translator.config, truncate=False)
        job = _Job(
            sources,
            sum(len(source) for source in sources),
            loop.time(),
            loop.create_future(),
            first_token=direction.first_token,
            nbest=nbest,
            constraints=constraints,
        )
        self._jobs.append(job)
        self._queued_tokens += job.num_tokens
        self._arrived.set()
        return await job.future

    async def _run(self) -> None:
        while self._jobs or not self._stopping:
            if not self._jobs:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            await self._gather()
            await self._decode(self._take_batch())

    async def _gather(self) -> None:
        """Wait for batch-mates of the oldest request: until the budget is full, its wait is
        over, or the batcher stops."""
        loop = asyncio.get_running_loop()
        deadline = self._jobs[0].arrived + self.max_wait_s
        while (
            not self._stopping
            and self._queued_tokens < self.max_batch_tokens
            and (remaining := deadline - loop.time()) > 0
        ):
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                break

    def _take_batch(self) -> list[_Job]:
        """Oldest first, whole requests, within the token budget (at least one request unless none
        is still awaited: a request whose handler was cancelled is dropped, not decoded)."""
        batch: list[_Job] = []
        num_tokens = 0
        while self._jobs and (
            not batch or num_tokens + self._jobs[0].num_tokens <= self.max_batch_tokens
        ):
            job = self._jobs.popleft()
            self._queued_tokens -= job.num_tokens
            if not job.future.done():
                batch.append(job)
                num_tokens += job.num_tokens
        return batch

    async def _decode(self, batch: list[_Job]) -> None:
        if not batch:
            return
        loop = asyncio.get_running_loop()
        waited_ms = (loop.time() - batch[0].arrived) * 1000
        started = time.perf_counter()
        sources = [source for job in batch for source in job.sources]
        first_tokens = (
            None
            if all(job.first_token is None for job in batch)
            else [job.first_token for job in batch for _ in job.sources]
        )
        nbest = max(job.nbest for job in batch)
        # Constraints travel per sentence: a request's never reach another's sentences.
        constraints = (
            None
            if all(job.constraints is None for job in batch)
            else [
                phrases
                for job in batch
                for phrases in (job.constraints or [[] for _ in job.sources])
            ]
        )
        try:
            texts, num_target_tokens = await loop.run_in_executor(
                self._executor, self._translate, sources, first_tokens, nbest, constraints
            )
        except Exception as error:  # a failed decode fails its own request, not the service
            if len(batch) > 1:  # nor the requests that shared its batch: each goes again alone
                logger.warning(
                    "decode of %d requests failed (%s: %s); decoding each alone",
                    len(batch),
                    type(error).__name__,
                    error,
                )
                for job in batch:
                    await self._decode([job])
                return
            logger.exception("decode of a request (%d sentences) failed", len(sources))
            if not batch[0].future.done():
                batch[0].future.set_exception(error)
            return
        self.num_batches += 1
        offset = 0
        for job in batch:
            if not job.future.done():  # done: the client went away (the handler was cancelled)
                job.future.set_result(
                    [nbest[: job.nbest] for nbest in texts[offset : offset + len(job.sources)]]
                )
            offset += len(job.sources)
        logger.info(
            "batch %d: %d requests, %d sentences, %d source tokens -> %d target tokens, %.1f ms (oldest waited %.1f ms)",
            self.num_batches,
            len(batch),
            len(sources),
            sum(job.num_tokens for job in batch),
            num_target_tokens,
            (time.perf_counter() - started) * 1000,
            waited_ms,
        )

    def _translate(
        self,
        sources: list[np.ndarray],
        first_tokens: list[int] | None,
        nbest: int,
        constraints: list[list[list[int]]] | None = None,
    ) -> tuple[list[list[str]], int]:
        """On the decode thread: the ``nbest`` best translations per source, and the target
        tokens of the best ones (EOS counted)."""
        options: dict[str, Any] = (
            {} if nbest == 1 else {"nbest": nbest, "beam": max(nbest, self.translator.config.beam)}
        )
        if constraints is not None:  # else the plain search, as before glossaries
            options["constraints"] = constraints
        nbests = self.translator.detokenize(
            self.translator.generate(sources, first_tokens=first_tokens, **options)
        )
        return [[t.text for t in found] for found in nbests], sum(
            len(found[0].tokens) + 1 for found in nbests
        )
