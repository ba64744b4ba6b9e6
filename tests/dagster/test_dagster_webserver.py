"""The real dagster-webserver serves the code location: assets visible over GraphQL."""
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from dagster_test_helpers import ROOT, dagster_bin, free_port, subprocess_env

QUERY = "{ assetNodes { assetKey { path } groupName } }"


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def _graphql(base: str, query: str) -> dict:
    req = urllib.request.Request(
        f"{base}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.mark.xdist_group("webserver")
def test_webserver_serves_main_assets(tmp_path, lake_home, dagster_home):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "webserver.log", "w+")
    proc = subprocess.Popen(
        [dagster_bin("dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT,
        env=subprocess_env(lake_home, dagster_home),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the code server goes down with it
    )

    def logs() -> str:
        log.flush()
        log.seek(0)
        return log.read()[-4000:]

    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"webserver exited {proc.returncode}:\n{logs()}"
            try:
                info = json.loads(_get(f"{base}/server_info"))
                break
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                pass
            assert time.monotonic() < deadline, f"webserver not up in 60 s:\n{logs()}"
            time.sleep(0.5)
        import dagster
        import dagster_webserver

        assert info["dagster_webserver_version"] == dagster_webserver.__version__
        assert info["dagster_version"] == dagster.__version__

        nodes = {}
        while True:  # the code location may still be loading right after startup
            data = _graphql(base, QUERY)
            assert not data.get("errors"), data
            nodes = {"/".join(n["assetKey"]["path"]): n["groupName"] for n in data["data"]["assetNodes"]}
            if nodes or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert nodes.get("raw_impressions") == "main", (nodes, logs())
        assert nodes.get("samples") == "main", (nodes, logs())
        assert nodes.get("labels") == "main", (nodes, logs())
        assert nodes.get("user_events") == "main", (nodes, logs())
        assert nodes.get("sequence_store") == "main", (nodes, logs())
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        log.close()
