"""How a training epoch's reading went, as the consuming process saw it: rows handed out and time spent waiting.

Why: a training job on a GPU needs to know whether it is bound by its input.
The time the consumer spends inside the reader's iterator, asking for the
next batch, answers that directly; :class:`EpochClock` measures it around
any batch stream (two clock reads a batch) and :class:`ReadStats` reports it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa


@dataclass(frozen=True)
class ReadStats:
    """One epoch of a :class:`featurelake.training.TrainingReader` in this process."""

    epoch: int
    batches: int  # handed out this epoch (a resumed epoch counts those before the resume too)
    rows: int  # handed out by this process
    waited_s: float  # the consumer's time inside the iterator, waiting for batches
    elapsed_s: float  # from the epoch's first request for a batch to its last batch
    first_batch_s: float | None  # from the first request to the first batch (start-up: planning, first decodes)

    @property
    def waiting_share(self) -> float:
        """``waited_s / elapsed_s``: near 1, training waits on its input; near 0, the input keeps ahead."""
        return self.waited_s / self.elapsed_s if self.elapsed_s > 0 else 0.0


class EpochClock:
    """Counts the rows of one epoch's batch streams and the time the consumer waited on each batch."""

    def __init__(self) -> None:
        self.rows = 0
        self.waited_s = 0.0
        self.first_batch_s: float | None = None
        self.started: float | None = None
        self.last_batch = 0.0

    def timed(self, stream: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``stream``, counted; closing this closes ``stream``."""
        clock = time.perf_counter
        began = clock()
        if self.started is None:
            self.started = began
        try:
            while True:
                t0 = clock()
                batch = next(stream, None)
                t1 = clock()
                self.waited_s += t1 - t0
                self.last_batch = t1
                if batch is None:
                    return
                if self.first_batch_s is None:
                    self.first_batch_s = t1 - began
                self.rows += batch.num_rows
                yield batch
        finally:
            stream.close()  # type: ignore[attr-defined]

    def stats(self, epoch: int, batches: int) -> ReadStats:
        elapsed = (self.last_batch - self.started) if self.started is not None and self.last_batch else 0.0
        return ReadStats(epoch=epoch, batches=batches, rows=self.rows, waited_s=round(self.waited_s, 6),
                         elapsed_s=round(max(elapsed, 0.0), 6),
                         first_batch_s=None if self.first_batch_s is None else round(self.first_batch_s, 6))
