"""Row sampling for training reads: a uniform rate, per-label rates, and the weights that keep the loss unbiased.

Why: recommendation models train on downsampled negatives (keep 10% of them,
weight each kept one 10). Whether a row is kept must not depend on how the
read is sharded, the epoch or the batch size, so it is decided by a hash of
``(seed, data file, row position)``: the same rows are kept by one worker or
eight, and a resumed reader keeps exactly what the first one would have.
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from featurelake.training import TrainingReader

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a stateless, well-mixed 64-bit hash of each element."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def path_hash(path: str) -> int:
    """A 64-bit hash of a file path that is the same in every process (``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(path.encode(), digest_size=8).digest(), "little")


def row_uniforms(seed: int, file_hash: int, positions: np.ndarray) -> np.ndarray:
    """A uniform [0, 1) number per row, fixed by (seed, file, row position)."""
    with np.errstate(over="ignore"):
        base = _mix(np.array([file_hash ^ (seed * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF)], dtype=np.uint64))
        x = _mix(positions.astype(np.uint64) * _GOLDEN + base)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def keep_rows(
    reader: "TrainingReader", rows: pa.Table, parts: Sequence[tuple[int, np.ndarray]]
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Which of ``rows`` the reader's sampling keeps (None: all), and each row's weight (None: no weight column).

    ``parts`` gives, in row order, each run of rows' task index (into
    ``reader.tasks``) and file positions. A kept row's weight is ``1 / its
    label's rate``; the uniform ``sample`` keeps the label mix, so it does not
    change weights.
    """
    n = rows.num_rows
    if reader.sample is None and not reader.label_rates:
        return None, (np.ones(n, np.float32) if reader.weight_column is not None else None)
    u = np.concatenate([row_uniforms(reader.seed, reader._hashes[task], pos) for task, pos in parts])
    label_rate = np.ones(n)
    if reader.label_rates:
        labels = rows.column(reader.label_column)
        for value, value_rate in reader.label_rates.items():
            hit = pc.fill_null(pc.equal(labels, pa.scalar(value, labels.type)), False).to_numpy(zero_copy_only=False)
            label_rate[hit] = value_rate
    keep = u < (reader.sample if reader.sample is not None else 1.0) * label_rate
    weights = (1.0 / label_rate).astype(np.float32) if reader.weight_column is not None else None
    return keep, weights
