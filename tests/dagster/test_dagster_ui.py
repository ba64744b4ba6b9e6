"""What a user sees in the Dagster UI after running jobs, served by the real `make ui`.

The jobs run in process here through :func:`platform_defs.runs.run_job` (as the demo runs
them); then `make ui` (dagster dev behind tools/dagster_ui.py) serves the instance and
its GraphQL API is asked what the UI's pages ask: the runs of each named job, the
partitions filled, the metadata of the latest materializations. Last, Ctrl-C must stop
`make ui` within seconds and leave no dagster process behind.
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dagster_test_helpers import ROOT, free_port, subprocess_env

VENV = Path(sys.executable).parent.parent
DAY = "2026-01-01"
SELECTOR = '{repositoryName: "__repository__", repositoryLocationName: "featurelake", pipelineName: "%s"}'
QUERY = """{
  main: pipelineOrError(params: %s) { ... on Pipeline { runs { runId status } } }
  nightly: pipelineOrError(params: %s) { ... on Pipeline { runs { runId status } } }
  samples: assetNodeOrError(assetKey: {path: ["samples"]}) {
    ... on AssetNode { partitionStats { numMaterialized numPartitions numFailed } } }
  labels: assetNodeOrError(assetKey: {path: ["labels"]}) { ... on AssetNode {
    assetMaterializations(limit: 1) { metadataEntries { label __typename
      ... on FloatMetadataEntry { floatValue } ... on IntMetadataEntry { intRepr } } } } }
  gc: assetNodeOrError(assetKey: {path: ["garbage_collection"]}) { ... on AssetNode {
    assetMaterializations(limit: 1) { runId metadataEntries { label __typename } } } }
}""" % (SELECTOR % "main_job", SELECTOR % "nightly_maintenance_job")


def _graphql(port: int, query: str) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        return json.loads(resp.read())


def _processes_with(marker: str) -> list[int]:
    """Live pids whose environment holds ``marker`` (a path unique to this test)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            zombie = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            if not zombie and marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except (OSError, IndexError):  # gone, or not ours to read
            continue
    return found


def _run_jobs(lake_home: Path, dagster_home: Path) -> dict:
    from dagster import DagsterInstance

    from platform_defs.runs import run_job
    from platform_defs.schedules import nightly_run_config
    from resources import LakeResource

    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    resources = {"lake": LakeResource(home=str(lake_home))}
    instance = DagsterInstance.from_config(str(dagster_home))
    try:
        main = run_job("main_job", instance, resources, partition_key=DAY,
                       asset_selection=["raw_impressions", "samples", "labels"],
                       run_config={**quiet, "ops": {"raw_impressions": {"config": {"rows_per_day": 200}}}})
        nightly = run_job("nightly_maintenance_job", instance, resources,
                          run_config={**quiet, **nightly_run_config(grace_days=0, dry_run=True)})
    finally:
        instance.dispose()
    assert main.success and nightly.success
    return {"main": main.run_id, "nightly": nightly.run_id}


@pytest.mark.xdist_group("webserver")
def test_ui_shows_named_job_runs_filled_partitions_and_stops_on_ctrl_c(tmp_path, lake_home, dagster_home):
    runs = _run_jobs(lake_home, dagster_home)
    port = free_port()
    env = subprocess_env(lake_home, dagster_home)
    env.pop("MAKEFLAGS", None)
    env["FEATURELAKE_PARTITIONS_DAYS"] = "1"  # the UI's daily partitions: the one day run above
    env["FEATURELAKE_UI_GRACE_S"] = "1"
    log = tmp_path / "ui.log"
    # `-o STAMP`: never reinstall the environment under test. Its own session stands for a terminal.
    proc = subprocess.Popen(
        ["make", "-s", "-o", str(VENV / ".installed"), "ui", f"VENV={VENV}", f"UI_ARGS=-h 127.0.0.1 -p {port}"],
        cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    marker = str(dagster_home)
    try:
        deadline = time.monotonic() + 120
        data: dict = {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                data = _graphql(port, QUERY)
                if not data.get("errors") and data["data"]["main"]:  # the code location has loaded
                    break
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                pass
            time.sleep(0.5)
        assert data.get("data") and not data.get("errors"), (data, log.read_text()[-3000:])
        got = data["data"]
        # Jobs and Overview list the runs under their jobs (before: all __ephemeral_asset_job__)
        assert [r["runId"] for r in got["main"]["runs"]] == [runs["main"]]
        assert [r["runId"] for r in got["nightly"]["runs"]] == [runs["nightly"]]
        assert {r["status"] for r in got["main"]["runs"] + got["nightly"]["runs"]} == {"SUCCESS"}
        # the partitions the UI knows are the days that were run: 100% filled
        assert got["samples"]["partitionStats"] == {"numMaterialized": 1, "numPartitions": 1, "numFailed": 0}
        # garbage_collection is materialized by the nightly job; byte counts come with MiB
        assert got["gc"]["assetMaterializations"][0]["runId"] == runs["nightly"]
        entries = {e["label"]: e for e in got["labels"]["assetMaterializations"][0]["metadataEntries"]}
        written = int(entries["bytes_written"]["intRepr"])
        assert entries["bytes_written_mib"]["__typename"] == "FloatMetadataEntry"
        assert entries["bytes_written_mib"]["floatValue"] == pytest.approx(written / 2**20, abs=1e-3)
        gc_entries = {e["label"]: e["__typename"] for e in got["gc"]["assetMaterializations"][0]["metadataEntries"]}
        assert gc_entries["per_table"] == "TableMetadataEntry"

        # Ctrl-C: SIGINT to the terminal's foreground group (make and the wrapper)
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
        while _processes_with(marker) and time.monotonic() - started < 30:
            time.sleep(0.2)
        elapsed = time.monotonic() - started
        assert not _processes_with(marker), "dagster processes left behind"
        # the wrapper's grace (1 s) plus slack; `dagster dev` alone took 4.6 s here, ~25 s under load
        assert elapsed < 3.5, f"make ui took {elapsed:.1f} s to stop"
    finally:
        for pid in _processes_with(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
