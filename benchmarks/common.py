"""Shared helpers for the side-by-side benchmarks.

Every benchmark runs featurelake and its baseline(s) in one process, on the
same machine state, interleaving repetitions so that noise on a shared machine
hits both sides alike. Timings keep every repetition; ratios use the best
(minimum) time of each side, the usual estimate of intrinsic cost on a noisy
machine, and the median is recorded next to it.
"""
from __future__ import annotations

import datetime as _dt
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent
RESULTS_DIR = ROOT / "results"
WORK_DIR = ROOT / ".work"

DEFAULT_ROWS = 1_000_000
DEFAULT_COLUMNS = 100  # sample_id + 99 features
DEFAULT_FILES = 8
QUICK_ROWS = 40_000
QUICK_COLUMNS = 20
KEY = "sample_id"


# ---------------------------------------------------------------- config
@dataclass
class Config:
    rows: int = DEFAULT_ROWS
    columns: int = DEFAULT_COLUMNS
    files: int = DEFAULT_FILES
    repeat: int = 3  # python -m benchmarks sets the benchmark's DEFAULT_REPEAT unless --repeat is given
    quick: bool = False
    keep: bool = False
    profile: bool = False
    out: Path = RESULTS_DIR
    seed: int = 42
    load_at_start: list[float] | None = None  # 1/5/15-minute load averages when the benchmark began
    git_at_start: dict[str, Any] | None = None  # engine revision when the benchmark began (its code is imported then)

    @property
    def result_suffix(self) -> str:
        return ".quick" if self.quick else ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "columns": self.columns,
            "data_files": self.files,
            "repeat": self.repeat,
            "quick": self.quick,
            "seed": self.seed,
        }

    def started(self) -> "Config":
        """A copy stamped with the machine load now (noise on a shared machine is recorded, not hidden)."""
        import dataclasses

        try:
            load = [round(x, 2) for x in os.getloadavg()]
        except (OSError, AttributeError):  # pragma: no cover
            load = None
        return dataclasses.replace(self, load_at_start=load, git_at_start=self.git_at_start or git_info())


# ------------------------------------------------------------- machine info
def machine_info() -> dict[str, Any]:
    import pyiceberg

    try:
        import featurelake

        fl_version = getattr(featurelake, "__version__", "dev")
    except Exception:  # pragma: no cover
        fl_version = "unknown"
    info = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "pyarrow": pa.__version__,
        "pyiceberg": pyiceberg.__version__,
        "numpy": np.__version__,
        "featurelake": fl_version,
        "arrow_cpu_threads": pa.cpu_count(),
        "arrow_io_threads": pa.io_thread_count(),
    }
    try:
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
        info["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        pass
    info.update(git_info())
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:  # pragma: no cover
        pass
    return info


def git_info() -> dict[str, Any]:
    """The engine revision measured (read-only git queries; empty outside a checkout)."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT.parent, capture_output=True, text=True, timeout=10).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").strip()
        dirty = [line[3:] for line in git("status", "--porcelain", "--", "featurelake").splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_head": head, "engine_uncommitted_files": dirty} if head else {}


# ------------------------------------------------------------------ timing
@dataclass
class Timing:
    """All repetitions of one measured operation, in seconds."""

    times: list[float] = field(default_factory=list)

    def add(self, seconds: float) -> None:
        self.times.append(seconds)

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def spread(self) -> float:
        """Slowest / fastest run: how noisy the machine was while this was measured."""
        return max(self.times) / min(self.times) if min(self.times) > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        return {
            "best_s": round(self.best, 6),
            "median_s": round(self.median, 6),
            "spread": round(self.spread, 3),
            "runs_s": [round(t, 6) for t in self.times],
        }


def timed(fn: Callable[[], Any], timing: Timing | None = None) -> tuple[float, Any]:
    """Run ``fn`` once after a garbage collection; return (seconds, result)."""
    gc.collect()
    t0 = time.perf_counter()
    result = fn()
    dt = time.perf_counter() - t0
    if timing is not None:
        timing.add(dt)
    return dt, result


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def paired_ratio(num: Timing, den: Timing) -> float | None:
    """Median over repetitions of num[i] / den[i].

    Both were measured back to back in the same repetition, so load that
    drifts on a shared machine cancels out within each pair; the median drops
    the pairs a burst of load hit. Used for the goal verdicts.
    """
    pairs = [a / b for a, b in zip(num.times, den.times) if b > 0]
    return round(statistics.median(pairs), 4) if pairs else None


def goal(name: str, measured: float | None, target: float, higher_is_better: bool = True, unit: str = "x") -> dict[str, Any]:
    met = measured is not None and (measured >= target if higher_is_better else measured <= target)
    return {
        "goal": name,
        "target": f"{'>=' if higher_is_better else '<='} {target}{unit}",
        "measured": measured,
        "met": bool(met),
    }


# ------------------------------------------------------------------- files
def local_path(uri: str) -> str:
    """A local filesystem path for a ``file://`` URI or plain path."""
    if uri.startswith("file:"):
        return unquote(urlparse(uri).path)
    return uri


def list_files(root: str | os.PathLike) -> dict[str, int]:
    """Every file under ``root`` with its size."""
    out: dict[str, int] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            try:
                out[p] = os.path.getsize(p)
            except OSError:
                pass
    return out


@dataclass
class NewFiles:
    """Files that appeared under a folder during an operation."""

    files: dict[str, int]

    @property
    def bytes(self) -> int:
        return sum(self.files.values())

    @property
    def count(self) -> int:
        return len(self.files)

    def bytes_where(self, predicate: Callable[[str], bool]) -> int:
        return sum(s for p, s in self.files.items() if predicate(p))

    def summary(self, root: str) -> dict[str, Any]:
        data = self.bytes_where(lambda p: f"{os.sep}data{os.sep}" in p)
        return {
            "files": self.count,
            "bytes": self.bytes,
            "data_bytes": data,
            "metadata_bytes": self.bytes - data,
        }


@contextmanager
def new_files(root: str | os.PathLike) -> Iterator[NewFiles]:
    before = list_files(root)
    result = NewFiles({})
    yield result
    after = list_files(root)
    result.files.update({p: s for p, s in after.items() if p not in before})


@contextmanager
def work_dir(name: str, keep: bool = False) -> Iterator[Path]:
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=WORK_DIR))
    try:
        yield path
    finally:
        if keep:
            print(f"  (kept work folder {path})")
        else:
            shutil.rmtree(path, ignore_errors=True)


# -------------------------------------------------------------------- data
def feature_names(columns: int) -> list[str]:
    return [f"f{i:03d}" for i in range(columns - 1)]


def wide_schema(columns: int) -> pa.Schema:
    """sample_id int64 plus ``columns - 1`` features: every third one float64, the rest float32."""
    fields = [pa.field(KEY, pa.int64(), nullable=False)]
    for i, name in enumerate(feature_names(columns)):
        fields.append(pa.field(name, pa.float64() if i % 3 == 2 else pa.float32()))
    return pa.schema(fields)


def wide_chunks(rows: int, columns: int, files: int, seed: int) -> Iterator[pa.Table]:
    """The benchmark table in ``files`` chunks of consecutive sample ids (random normal features)."""
    schema = wide_schema(columns)
    rng = np.random.default_rng(seed)
    bounds = np.linspace(0, rows, files + 1).astype(np.int64)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        n = int(hi - lo)
        arrays = [pa.array(np.arange(lo, hi, dtype=np.int64))]
        for f in schema.names[1:]:
            dtype = np.float64 if schema.field(f).type == pa.float64() else np.float32
            arrays.append(pa.array(rng.standard_normal(n, dtype=dtype)))
        yield pa.Table.from_arrays(arrays, schema=schema)


def build_wide_table(lake, name: str, cfg: Config, properties: dict[str, str] | None = None):
    """Create ``name`` and append the benchmark data in ``cfg.files`` commits (one data file each)."""
    t = lake.create_table(name, wide_schema(cfg.columns), primary_key=KEY, partition_by=[], properties=properties)
    for chunk in wide_chunks(cfg.rows, cfg.columns, cfg.files, cfg.seed):
        t.append(chunk)
    return t


def table_root(t) -> str:
    return local_path(t.iceberg.location())


def data_file_paths(ice, snapshot_id: int | None = None) -> list[str]:
    return [local_path(task.file.file_path) for task in ice.scan(snapshot_id=snapshot_id).plan_files()]


# ----------------------------------------------------------------- output
def write_result(name: str, cfg: Config, result: dict[str, Any]) -> Path:
    cfg.out.mkdir(parents=True, exist_ok=True)
    path = cfg.out / f"{name}{cfg.result_suffix}.json"
    machine = machine_info()
    if cfg.load_at_start is not None:
        machine["load_avg_at_start"] = cfg.load_at_start
    if cfg.git_at_start:
        # the revision measured is the one imported at the start; record the end too when it moved
        end = {k: machine.pop(k) for k in ("git_head", "engine_uncommitted_files") if k in machine}
        machine.update(cfg.git_at_start)
        if end and end != cfg.git_at_start:
            machine["git_at_end"] = end
    payload = {"benchmark": name, "machine": machine, "config": cfg.as_dict(), **result}
    path.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
    return path


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def fmt_s(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def fmt_rate(rows_per_s: float) -> str:
    return f"{rows_per_s / 1e6:.2f} M rows/s"


def print_profile(name: str, p: dict[str, Any], n: int = 10) -> None:
    print(f"  profile of {name} ({fmt_s(p['wall_s'])} under cProfile)")
    print("    by own time:")
    for row in p["top_self"][:n]:
        print(f"      {row['tottime_s']:>8.3f}s  {row['function']}")
    print("    by cumulative time:")
    for row in p["top_cumulative"][:n]:
        print(f"      {row['cumtime_s']:>8.3f}s  {row['function']}")


def print_goals(goals: list[dict[str, Any]]) -> None:
    for g in goals:
        mark = "MET " if g["met"] else "MISS"
        print(f"  [{mark}] {g['goal']}: measured {g['measured']} (target {g['target']})")


def profile_call(fn: Callable[[], Any], top: int = 25) -> tuple[Any, list[dict[str, Any]], str]:
    """Run ``fn`` under cProfile; return (result, top functions by cumulative time, text)."""
    result, summary = profile_summary(fn, top)
    return result, summary["top_cumulative"], summary["text"]


def profile_summary(fn: Callable[[], Any], top: int = 25) -> tuple[Any, dict[str, Any]]:
    """Run ``fn`` under cProfile (main thread only); return (result, profile summary).

    The summary holds the wall time, the top functions by cumulative and by
    own (self) time, and the printed cumulative listing.
    """
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    result = prof.runcall(fn)
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof)
    rows = []
    for (filename, line, func), (cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{_short(filename)}:{line}({func})",
                "calls": nc,
                "tottime_s": round(tt, 4),
                "cumtime_s": round(ct, 4),
            }
        )
    by_cum = sorted(rows, key=lambda r: r["cumtime_s"], reverse=True)[:top]
    by_self = sorted(rows, key=lambda r: r["tottime_s"], reverse=True)[:top]
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    text = buf.getvalue().replace(str(ROOT.parent) + "/", "")
    return result, {"wall_s": round(wall, 4), "top_cumulative": by_cum, "top_self": by_self, "text": text}


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/work/main/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename
