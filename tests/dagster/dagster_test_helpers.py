"""Helpers shared by the Dagster layer tests (imported by name: tests/dagster is on sys.path)."""
import os
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
ROWS = 500  # rows per day: small, so the whole directory runs well under 90 s

if str(ROOT) not in sys.path:  # `pytest` run from elsewhere: the code location lives at the root
    sys.path.insert(0, str(ROOT))


def dagster_bin(name: str) -> str:
    path = VENV_BIN / name
    return str(path) if path.exists() else name


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(lake_home: Path, dagster_home: Path) -> dict:
    """Environment for a Dagster CLI/webserver subprocess using the tmp lake."""
    env = dict(os.environ)
    for name in ("FEATURELAKE_CATALOG_URI", "FEATURELAKE_WAREHOUSE", "FEATURELAKE_LANDING"):
        env.pop(name, None)
    env["FEATURELAKE_HOME"] = str(lake_home)
    env["DAGSTER_HOME"] = str(dagster_home)
    env["DAGSTER_DISABLE_TELEMETRY"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env
