"""Worker faults for the Ray tests: a Ray worker that SIGKILLs itself right after it wrote files.

Installed in every worker of the test session's cluster (``worker_process_setup_hook``).
A test arms a kind by creating ``<fault dir>/<kind>.once`` (the first worker to get
there dies, once) or ``<kind>.always`` (every attempt dies, so Ray's retries run out).
The driver process is never patched, so single-process oracles run untouched.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

KINDS = {"backfill": ("featurelake.updates", "write_job"), "compact": ("featurelake.maintenance", "write_files")}


ENV = "FEATURELAKE_TEST_FAULTS"  # the fault folder, set in the workers' environment


def install() -> None:
    import importlib

    fault_dir = os.environ.get(ENV)
    if not fault_dir:
        return

    for kind, (module_name, name) in KINDS.items():
        module = importlib.import_module(module_name)
        original = getattr(module, name)

        def wrapped(*args, __original=original, __kind=kind, **kwargs):
            out = __original(*args, **kwargs)  # the files exist: the death leaves them behind
            _maybe_die(Path(fault_dir), __kind)
            return out

        setattr(module, name, wrapped)


def _maybe_die(fault_dir: Path, kind: str) -> None:
    if (fault_dir / f"{kind}.always").exists():
        os.kill(os.getpid(), signal.SIGKILL)
    once = fault_dir / f"{kind}.once"
    try:
        os.rename(once, fault_dir / f"{kind}.fired")  # atomic: exactly one worker dies
    except FileNotFoundError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def arm(fault_dir: Path, kind: str, always: bool = False) -> None:
    (fault_dir / f"{kind}.{'always' if always else 'once'}").touch()


def disarm(fault_dir: Path) -> None:
    for p in fault_dir.iterdir():
        p.unlink()


def fired(fault_dir: Path, kind: str) -> bool:
    return (fault_dir / f"{kind}.fired").exists()
