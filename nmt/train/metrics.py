"""Training metrics: one line per record (simple text on stderr, or JSON on stdout), TensorBoard
scalars, and the window of updates between two training records (whose device-side sums are read
once, at the record)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from nmt.config import LoggingConfig
from nmt.train.step import Reading, UpdateStats, bits
from nmt.train.stopping import Progress
from nmt.train.validate import perplexity

logger = logging.getLogger("nmt.train")


class MetricsLog:
    def __init__(self, cfg: LoggingConfig, *, enabled: bool, tensorboard: bool) -> None:
        """``enabled``: this rank logs (rank 0, or all with --log-all-ranks); ``tensorboard``: this
        rank writes the TensorBoard file (rank 0 only)."""
        self.cfg = cfg
        self.enabled = enabled
        self.writer = None
        self.log_file = None
        if enabled and cfg.log_file:
            # Every log line of the run goes there too (the records and the messages).
            handler = logging.FileHandler(cfg.log_file, encoding="utf-8")
            handler.setFormatter(
                logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s")
            )
            logging.getLogger().addHandler(handler)
            self.log_file = handler
        if tensorboard and cfg.tensorboard_logdir:
            try:
                from torch.utils.tensorboard import (
                    SummaryWriter,  # lazy: slow to import, rarely needed
                )
            except ImportError:  # an optional dependency (the tensorboard extra)
                raise ValueError(
                    "--tensorboard-logdir: the tensorboard package is not installed (pip install 'nmt[tensorboard]')"
                ) from None

            self.writer = SummaryWriter(cfg.tensorboard_logdir)
        self._window = _Window()

    def log(self, values: dict[str, Any], *, prefix: str, update: int, epoch: int) -> None:
        """``epoch`` as the user counts it (1-based)."""
        if not self.enabled:
            return
        record = {"update": update, "epoch": epoch, **values}
        if self.cfg.log_format == "json":
            # "time": wall clock, Unix seconds (nmt-plot draws against it)
            line = json.dumps({"kind": prefix, **record, "time": round(time.time(), 3)})
            print(line, flush=True)
            if self.log_file is not None:
                self.log_file.stream.write(line + "\n")
                self.log_file.flush()
        else:
            text = " | ".join(
                f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()
            )
            logger.info("%s | %s", prefix, text)
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(f"{prefix}/{key}", value, update)

    def count(self, stats: UpdateStats) -> None:
        """Count an update's host-side figures into the window."""
        self._window.add(stats)

    def due(self, at: Progress) -> bool:
        """Every --log-interval updates: the device is read then, and only then."""
        return at.update % self.cfg.log_interval == 0

    def log_reading(self, reading: Reading, *, at: Progress, lr: float) -> None:
        """The record of the updates since the last one: losses per target token in base 2 (as
        fairseq reports them), token and sentence totals, throughput, the last gradient norm."""
        window = self._window
        nll = bits(reading.nll, window.tokens)
        values = {
            "loss": bits(reading.loss, window.tokens),
            "nll": nll,
            "ppl": perplexity(nll),
            "lr": lr,
            "ntokens": window.tokens,
            "nsentences": window.sentences,
            "wps": window.words_per_second(),
            "gnorm": reading.grad_norm,
            "padding_ratio": window.padding_ratio(),
            "loss_scale": reading.loss_scale,
            "skipped": reading.skipped_updates,
        }
        self.log(values, prefix="train", update=at.update, epoch=at.epoch)
        self._window = _Window()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.log_file is not None:
            logging.getLogger().removeHandler(self.log_file)
            self.log_file.close()


class _Window:
    """Tokens and padding since the last training record."""

    def __init__(self) -> None:
        self.tokens = self.sentences = self.padded = self.real = 0
        self.started = time.perf_counter()

    def add(self, stats: UpdateStats) -> None:
        self.tokens += stats.ntokens
        self.sentences += stats.nsentences
        self.padded += stats.padded_tokens
        self.real += stats.real_tokens

    def words_per_second(self) -> float:
        return self.tokens / max(time.perf_counter() - self.started, 1e-9)

    def padding_ratio(self) -> float:
        return 1.0 - self.real / max(self.padded, 1)
