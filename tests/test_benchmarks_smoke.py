"""Each benchmark runs in quick mode with small sizes and writes its JSON (figures are not checked).

Results go to tmp_path (``--out``): the committed results in benchmarks/results/
stay as they are.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--rows", "4000", "--columns", "8", "--files", "2", "--repeat", "1"]


def _committed() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((ROOT / "benchmarks" / "results").glob("*.json"))}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_benchmark_quick_smoke_run(name, tmp_path):
    committed = _committed()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", name, "--quick", *SMALL, "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=240,
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    [written] = list(tmp_path.glob("*.json"))
    assert written.name == f"{name}.quick.json"
    result = json.loads(written.read_text())
    assert result["benchmark"] == name and result["config"]["quick"] is True
    assert _committed() == committed  # the committed results were not touched
