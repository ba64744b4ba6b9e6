"""``make ui``: ``dagster dev`` that stops within seconds on Ctrl-C or SIGTERM.

``dagster dev`` ignores SIGINT while its code location loads and then takes its
time shutting down the webserver, the daemon and the code server; killed from
``make`` its children can outlive it. This wrapper starts it in its own process
group, and on SIGINT or SIGTERM asks the group to stop (SIGINT, dagster's own
graceful path), waits ``FEATURELAKE_UI_GRACE_S`` seconds (default 5), then
kills whatever of the group is left, so no dagster process survives the
wrapper. Arguments are passed to ``dagster dev``.

Usage: python tools/dagster_ui.py -w workspace.yaml [-p PORT]
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _dagster() -> str:
    local = Path(sys.executable).with_name("dagster")
    return str(local) if local.exists() else "dagster"


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we cannot signal still exists
        return True


def main(argv: list[str]) -> int:
    grace = float(os.environ.get("FEATURELAKE_UI_GRACE_S") or 5)
    proc = subprocess.Popen([_dagster(), "dev", *argv], start_new_session=True)
    received: list[int] = []

    def stop(signum: int, _frame) -> None:
        received.append(signum)
        _signal_group(proc.pid, signal.SIGINT)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while proc.poll() is None and not received:
        try:
            proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + grace
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        proc.poll()  # reap dagster dev itself as soon as it exits
        time.sleep(0.1)
    _signal_group(proc.pid, signal.SIGKILL)
    code = proc.wait()
    return 128 + received[0] if received else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
