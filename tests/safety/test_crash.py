"""kill -9 at every write kind's file creates and catalog commits: nothing lost, nothing poisoned.

Each trial copies a base lake (same path, so its absolute file locations stay valid), runs one
write in a child process (a forkserver child: featurelake is imported once) and SIGKILLs it:
deterministically, at the Nth file create or catalog commit event (before or after the call;
see crash_ops.Tripwire), or after a random delay. Then, in this process:

- every ref is at its pre-state (same snapshot id, same rows) or its post-state (a new snapshot
  on top of the old head, rows equal to the pyarrow oracle); refs the write does not touch
  keep their snapshot id; no ref appears or vanishes except the one created;
- every ref reads without error, its key index verifies, and its rows by key equal the oracle;
- ``collect_garbage(older_than=0)`` then runs, and every ref still reads the same and verifies;
- a lake left at the pre-state accepts the same write again, which reaches the post-state.

By default a seeded sample of points per kind runs (FEATURELAKE_CRASH_SEED, default 0);
``pytest --long`` tries every point and more random delays.

On REST + S3 (``test_kill_minus_nine_at_a_commit_on_s3``) append, upsert, compact and merge are
killed at the REST catalog's commit, just before or just after it (seeded); ``--long`` kills every
write kind on both sides. A bucket cannot be copied like a home folder, so each trial rebuilds the
base lake on the session's SeaweedFS (~1.5 s); the checks are the same (oracles per ref, index,
GC, the write again).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
import time
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

import crash_ops as ops
from featurelake import Lake

SEED = int(os.environ.get("FEATURELAKE_CRASH_SEED", "0"))
POINTS_PER_KIND = 2  # default run: deterministic points per kind (plus one random delay)
RANDOM_DELAYS_LONG = 6
TRIALS = ops.TRIALS  # what ran: printed in the terminal summary (tests/safety/conftest.py)


@pytest.fixture(scope="module")
def forkserver():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["featurelake", "pyiceberg.catalog.sql", "pyiceberg.io.pyarrow", "crash_ops"])
    return ctx


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The base lake, built once at ``root/lake`` and kept as a pristine copy in ``root/base``."""
    root = tmp_path_factory.mktemp("crash")
    names = ops.build_base(root / "lake")
    shutil.copytree(root / "lake", root / "base")
    ice = Lake(root / "lake").table(ops.TABLE).refresh()
    pre_ids = {name: ref.snapshot_id for name, ref in ice.metadata.refs.items()}
    assert set(pre_ids) == {"main", "dev"}
    return root, names, pre_ids


def _fresh(root: Path) -> Path:
    home = root / "lake"
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(root / "base", home)
    return home


def _run_child(ctx, home: Path, kind: str, names: dict, kill_at: int | str, delay: float | None = None,
               where: dict | None = None) -> dict | None:
    """Run ``kind`` in a child on the lake at ``where`` (default: the home folder ``home``); returns its
    report (written beside ``home``), or None when it was killed."""
    report = home.parent / "report.json"
    report.unlink(missing_ok=True)
    started = ctx.Event()
    target = str(home) if where is None else where
    proc = ctx.Process(target=ops.child, args=(target, kind, names, kill_at, str(report), started))
    proc.start()
    if delay is not None:
        assert started.wait(60)
        time.sleep(delay)
        try:  # a forkserver child is reaped by the forkserver: it may be gone already
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it finished before the delay ran out
            pass
    proc.join(120)
    assert proc.exitcode in (0, -signal.SIGKILL), f"{kind}: child exit {proc.exitcode}"
    if proc.exitcode == 0:
        return json.loads(report.read_text())
    return None


def _rows(table: pa.Table) -> list[dict]:
    return table.select(ops.SCHEMA.names).sort_by(ops.KEY).to_pylist()


def _check_refs(home: "Path | dict", kind: str, pre_ids: dict) -> dict[str, str]:
    """Every ref at its pre- or post-state, readable, indexed right; returns ref -> 'pre'/'post'."""
    pre, post = ops.base_oracles(), ops.post_oracles(kind)
    lake = ops.open_lake(home)
    t = lake.table(ops.TABLE)
    ice = t.refresh()
    heads = {name: ref.snapshot_id for name, ref in ice.metadata.refs.items()}
    assert set(pre_ids) <= set(heads) <= set(post), (kind, heads)
    states = {}
    for ref, head in heads.items():
        if ref not in ops.MOVES[kind]:
            assert head == pre_ids[ref], (kind, ref)
        if ref in pre_ids and head == pre_ids[ref]:
            states[ref], want = "pre", pre[ref]
        else:
            states[ref], want = "post", post[ref]
            if ref in pre_ids:  # one new snapshot on the old head (a rebase lands on main's head)
                parent = ice.snapshot_by_id(head).parent_snapshot_id
                assert parent in (pre_ids[ref], pre_ids["main"]), (kind, ref, parent)
            else:  # a new branch starts at main's head: zero-copy
                assert head == pre_ids["main"], (kind, ref)
        assert _rows(t.read(branch=ref)) == _rows(want), (kind, ref, states[ref])
        report = t.verify_index(branch=ref)
        assert report["ok"], (kind, ref, report)
    if kind == "create_table" and lake.table_exists(ops.NEW_TABLE):
        states[ops.NEW_TABLE] = "post"
        assert lake.table(ops.NEW_TABLE).read().num_rows == 0
    return states


def _check_trial(home: "Path | dict", kind: str, names: dict, pre_ids: dict, label: str) -> dict[str, str]:
    """The checks after a kill (see the module docstring); returns the state each ref was left in."""
    states = _check_refs(home, kind, pre_ids)
    ops.open_lake(home).collect_garbage(older_than=timedelta(0))
    assert _check_refs(home, kind, pre_ids) == states, (kind, label)
    at_pre = all(states.get(ref) != "post" for ref in ops.MOVES[kind] | {ops.NEW_TABLE})
    if at_pre and kind not in ("compact", "expire_gc"):  # the same write again reaches the post-state
        ops.run(home, kind, names)
        assert set(_check_refs(home, kind, pre_ids).values()) <= {"pre", "post"}
        assert "post" in _check_refs(home, kind, pre_ids).values() or kind == "create_table"
    TRIALS[f"{kind}:{'pre' if at_pre else 'post'}"] += 1
    return states


def _sample(events: list[str], long_run: bool, rng: random.Random) -> list[int]:
    """1-based kill points: all of them under --long, else the commit boundary and a seeded pick."""
    points = list(range(1, len(events) + 1))
    if long_run:
        return points
    commit = [i for i in points if "commit_table" in events[i - 1] or "create_table" in events[i - 1]]
    files = [i for i in points if i not in commit]
    picks = [rng.choice(commit)] + ([rng.choice(files)] if files else [])
    return sorted(set(picks))[:POINTS_PER_KIND]


@pytest.mark.parametrize("kind", ops.KINDS)
def test_kill_minus_nine(kind, base, forkserver, long_run):
    root, names, pre_ids = base
    rng = random.Random(f"{SEED}-{kind}")

    # a full run, instrumented: counts the events and checks the oracles describe the post-state
    home = _fresh(root)
    full = _run_child(forkserver, home, kind, names, kill_at=-1)
    assert full is not None and full["events"], kind
    states = _check_refs(home, kind, pre_ids)
    assert all(states[ref] == "post" for ref in ops.MOVES[kind]), (kind, states)

    for point in _sample(full["events"], long_run, rng):
        home = _fresh(root)
        assert _run_child(forkserver, home, kind, names, kill_at=point) is None, (kind, point)
        _check_trial(home, kind, names, pre_ids, f"point {point} ({full['events'][point - 1]})")

    for _ in range(RANDOM_DELAYS_LONG if long_run else 1):
        home = _fresh(root)
        delay = rng.uniform(0, full["seconds"] * 1.2)
        _run_child(forkserver, home, kind, names, kill_at=-1, delay=delay)
        _check_trial(home, kind, names, pre_ids, f"random delay {delay:.3f} s")


# ------------------------------------------------------------------ REST + S3
S3_KINDS = ("append", "upsert", "compact", "merge")  # new files, index + updates, a rewrite, a merge commit


@pytest.fixture(scope="module")
def s3_where(seaweed, tmp_path_factory) -> dict:
    """``Lake.from_uri`` arguments of the session's REST catalog + S3 (a local cache folder of its own)."""
    cache = tmp_path_factory.mktemp("crash-s3")
    return {"uri": seaweed.catalog_uri, "warehouse": seaweed.warehouse, "cache_dir": str(cache / "cache"),
            **seaweed.catalog_properties()}


def _fresh_s3(where: dict) -> tuple[dict, dict]:
    """The base lake rebuilt on an emptied catalog: (names, each ref's snapshot id)."""
    lake = ops.open_lake(where)
    for name in lake.tables():
        lake.drop_table(name, purge=True)
    names = ops.build_base(where)
    ice = ops.open_lake(where).table(ops.TABLE).refresh()
    return names, {name: ref.snapshot_id for name, ref in ice.metadata.refs.items()}


@pytest.mark.s3
@pytest.mark.parametrize("kind", ops.KINDS)
def test_kill_minus_nine_at_a_commit_on_s3(kind, s3_where, forkserver, long_run):
    if kind not in S3_KINDS and not long_run:
        pytest.skip("on S3 by default: append, upsert, compact and merge (--long: every kind)")
    rng = random.Random(f"{SEED}-s3-{kind}")
    sides = ["before", "after"] if long_run else [rng.choice(["before", "after"])]
    event = "create_table" if kind == "create_table" else "commit_table"  # its first catalog call
    moved = ops.MOVES[kind] | ({ops.NEW_TABLE} if kind == "create_table" else set())
    report_dir = Path(s3_where["cache_dir"]).parent / "trial"
    for side in sides:
        names, pre_ids = _fresh_s3(s3_where)
        assert _run_child(forkserver, report_dir, kind, names, kill_at=f"{side} {event}", where=s3_where) is None
        states = _check_trial(s3_where, kind, names, pre_ids, f"{side} {event}")
        # killed before the catalog call: nothing moved; after it: the write is there
        assert {states.get(ref, "pre") for ref in moved} <= {"pre" if side == "before" else "post"}, (kind, side, states)
