"""Parquet writer settings of data files and update files: the one place they are chosen.

Each setting is read from the table property Iceberg names for it, falling
back to the default here. New tables get ``write.parquet.compression-codec``
from :data:`DEFAULTS` (see featurelake.schema.table_properties); tables that
name another codec keep it.

Why LZ4 (measured on this repo's benchmark data, 125k rows x 71 columns of
random float32/float64 features, and on ``featurelake.synthetic``, single
thread, CPU time):

====================  =========  ========  =======  ===========
data, codec           write      read      bytes    vs zstd
====================  =========  ========  =======  ===========
benchmark, zstd(1)    84 ms      86 ms     44.3 MB
benchmark, lz4        48 ms      13 ms     47.7 MB  +7.7% bytes
synthetic, zstd(1)    660 ms     169 ms    48.5 MB
synthetic, lz4        597 ms     67 ms     52.6 MB  +8.5% bytes
====================  =========  ========  =======  ===========

Feature columns are mostly distinct floats, which no fast codec shrinks much,
so zstd spends its time for 7-9% of bytes while decoding 2.5-6.5x slower:
LZ4 (LZ4_RAW in the file) makes appends and whole-column writes faster and
every read cheaper. A table that is read over a slow network more than it is
written can set ``write.parquet.compression-codec=zstd`` (and a level).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa
from pyiceberg.utils.properties import property_as_int

CODEC = "write.parquet.compression-codec"
LEVEL = "write.parquet.compression-level"
PAGE_BYTES = "write.parquet.page-size-bytes"
DICT_BYTES = "write.parquet.dict-size-bytes"
PAGE_ROWS = "write.parquet.page-row-limit"
ROW_GROUP_ROWS = "write.parquet.row-group-limit"


@dataclass(frozen=True)
class WriterSettings:
    """The Parquet settings one write uses for all of its files."""

    codec: str = "lz4"
    level: int | None = None
    page_bytes: int = 1024 * 1024
    dictionary_page_bytes: int = 2 * 1024 * 1024
    page_rows: int = 20_000  # rows Arrow encodes per batch (pyiceberg's write.parquet.page-row-limit default)
    row_group_rows: int = 1_048_576  # pyiceberg's write.parquet.row-group-limit default

    @staticmethod
    def of(properties: Mapping[str, str]) -> "WriterSettings":
        """The settings a table's properties ask for (defaults where they say nothing)."""
        d = DEFAULTS
        return WriterSettings(
            codec=properties.get(CODEC, d.codec),
            level=property_as_int(dict(properties), LEVEL, d.level),
            page_bytes=property_as_int(dict(properties), PAGE_BYTES, d.page_bytes) or d.page_bytes,
            dictionary_page_bytes=property_as_int(dict(properties), DICT_BYTES, d.dictionary_page_bytes) or d.dictionary_page_bytes,
            page_rows=property_as_int(dict(properties), PAGE_ROWS, d.page_rows) or d.page_rows,
            row_group_rows=property_as_int(dict(properties), ROW_GROUP_ROWS, d.row_group_rows) or d.row_group_rows,
        )

    @property
    def compression(self) -> str:
        """The codec as pyarrow names it."""
        return "none" if self.codec == "uncompressed" else self.codec

    def parquet_kwargs(self) -> dict:
        """Keyword arguments of ``pq.ParquetWriter`` / ``pq.write_table`` for these settings."""
        return {
            "compression": self.compression,
            "compression_level": self.level,
            "data_page_size": self.page_bytes,
            "dictionary_pagesize_limit": self.dictionary_page_bytes,
            "write_batch_size": self.page_rows,
        }


DEFAULTS = WriterSettings()


ENCODING_PROPERTY = "featurelake.parquet.encoding."  # + column path -> a Parquet encoding for that column


def column_encodings(props: Mapping[str, str], schema: pa.Schema) -> dict[str, str]:
    """Per-column Parquet encodings a table asks for (``featurelake.parquet.encoding.<column>``).

    Why: a sorted time column costs ~4 bytes a value as DELTA_BINARY_PACKED
    deltas against ~7 as PLAIN + zstd, and byte-split floats compress ~5%
    better (measured on event tables sorted by (user, time)). A column named
    here gets no dictionary. Only top-level columns whose type the encoding
    fits are honoured; anything else is ignored, so a table stays writable
    whatever its properties say.
    """
    out = {}
    for key, value in props.items():
        if not key.startswith(ENCODING_PROPERTY):
            continue
        name, enc = key[len(ENCODING_PROPERTY):], value.strip().upper()
        if name in schema.names and _encoding_fits(enc, schema.field(name).type):
            out[name] = enc
    return out


def _encoding_fits(enc: str, t: pa.DataType) -> bool:
    ints = (pa.types.is_integer(t) and t.bit_width >= 32) or pa.types.is_timestamp(t) or pa.types.is_date(t) \
        or pa.types.is_time(t) or pa.types.is_duration(t)
    if enc == "DELTA_BINARY_PACKED":
        return ints
    if enc == "BYTE_STREAM_SPLIT":
        return pa.types.is_floating(t) and t.bit_width >= 32
    if enc in ("DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY"):
        return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
    return enc == "PLAIN"
