"""The demo's research, training-target and storage sections (registered by platform_defs/demo.py).

Like the maintenance section, the research and target sections *run* their
part of the demo on the demo's persistent Dagster instance (so ``make ui``
shows the runs and the check results), then summarize:

* ``research`` -- research branch ``ctr-v2`` of assets/research_spec.yaml with
  two candidate features. Attempt 1 materializes the whole research group for
  it: ``f0_f1_blend`` passes every expectation, ``f2_norm`` fails three, the
  blocking checks stop ``branch_merge`` and main's snapshot id is unchanged.
  Attempt 2 is what the researcher does next: narrow the branch to the
  candidates that passed (run config ``features``) and materialize again --
  the branch is rebuilt from main, the rejected column is retired, the gate
  passes and the branch is merged. So of the branch's two candidates one
  reaches main and one is blocked: the gate is per branch, and a blocked
  branch's good candidates are promoted by narrowing the branch.
* ``training targets`` -- two label targets (``ctr``, ``long_dwell``), each
  backfilled on its own label branch; main untouched.
* ``storage`` -- every branch of ml.samples: bytes it owns alone (exclusive)
  versus bytes shared with other refs.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

DEMO_BRANCH = "ctr-v2"
DEMO_TARGETS = ("ctr", "long_dwell")
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
TAGS = {"featurelake/demo": "true"}


def _ready(lake, context: dict) -> bool:
    from assets.main import SAMPLES_TABLE

    return bool(context.get("dagster_home") and context.get("home")) and SAMPLES_TABLE in lake.tables()


def _instance(context: dict):
    from dagster import DagsterInstance

    return DagsterInstance.from_config(str(context["dagster_home"]))


def _checks(result) -> dict[str, dict]:
    """Check name -> {passed, severity, metadata values} from one run."""
    out = {}
    for ev in result.get_asset_check_evaluations():
        out[ev.asset_check_key.name] = {
            "passed": ev.passed,
            "severity": ev.severity.value,
            "metadata": {k: v.value for k, v in ev.metadata.items()},
        }
    return out


def _materialized(result, node: str) -> Optional[dict]:
    mats = result.asset_materializations_for_node(node)
    return {k: v.value for k, v in mats[-1].metadata.items()} if mats else None


def run_research(lake, context: dict, key: str = DEMO_BRANCH) -> Optional[dict]:
    """Run the research group for ``key`` (attempt 1 as specified, attempt 2 narrowed); summarize."""
    from assets import research
    from assets.main import SAMPLES_TABLE
    from platform_defs.runs import run_job
    from resources import LakeResource

    if not _ready(lake, context):
        return None
    spec = research.load_spec()
    entry = spec["research_branches"].get(key)
    if entry is None:
        return None
    resource = {"lake": LakeResource(home=str(context["home"]))}
    t = lake.table(SAMPLES_TABLE)
    instance = _instance(context)
    attempts: list[dict] = []
    verdicts: dict[str, dict] = {}
    retired = ""
    try:
        instance.add_dynamic_partitions(research.research_partitions.name, [key])
        plan = [("as specified", list(entry["features"]))]
        for label, feats in plan:
            main_before = t.branches()["main"]
            started = time.perf_counter()
            run_config = dict(QUIET)
            if feats != entry["features"]:
                run_config["ops"] = {"research_branch": {"config": {"features": feats}}}
            result = run_job(research.research_job.name, instance, resource, partition_key=key,
                             run_config=run_config, tags=TAGS, raise_on_error=False)
            checks = _checks(result)
            merged = _materialized(result, "branch_merge") is not None
            failing = [f for c in checks.values() for f in
                       (c["metadata"].get("failing_expectations") or "").split(", ") if f]
            main_after = t.branches()["main"]
            attempts.append({
                "label": label,
                "features": feats,
                "checks_passed": sum(c["passed"] for c in checks.values()),
                "checks": len(checks),
                "failing": failing,
                "merged": merged,
                "main_before": main_before,
                "main_after": main_after,
                "run_id": result.run_id,
                "seconds": round(time.perf_counter() - started, 2),
            })
            for feat in feats:
                row = verdicts.setdefault(feat, {})
                for kind, c in checks.items():
                    obs = (c["metadata"].get("observed") or {}).get(feat)
                    if obs is not None:
                        row.update(_observed_cells(kind, obs))
                bad = [f.split(".", 1)[1] for f in failing if f.split(".", 1)[0] == feat]
                row["verdict"] = "passed" if not bad else "FAILED: " + ", ".join(bad)
            retired = (_materialized(result, "research_branch") or {}).get("retired_columns", "") or retired
            if not merged and len(plan) == 1:
                passing = [f for f in feats if verdicts[f]["verdict"] == "passed"]
                if passing and passing != feats:  # the researcher narrows the branch to what passed
                    plan.append(("narrowed to what passed", passing))
    finally:
        instance.dispose()

    out: dict[str, Any] = {
        "branch": research.branch_for(key),
        "spec": f"{key}: {', '.join(entry['features'])} ({Path(spec['path']).name})",
    }
    for i, a in enumerate(attempts, 1):
        if a["merged"]:
            gate = f"merged ({a['checks_passed']}/{a['checks']} checks passed)"
        else:
            gate = f"BLOCKED ({a['checks'] - a['checks_passed']}/{a['checks']} checks failed: {', '.join(a['failing'])})"
        out[f"attempt {i}"] = f"{a['label']}: {', '.join(a['features'])} -> {gate}"
        moved = "unchanged" if a["main_before"] == a["main_after"] else "moved by the merge"
        out[f"attempt {i} main snapshot"] = f"{a['main_before']} -> {a['main_after']} ({moved})"
    main_cols = set(t.schema.names)
    merged_feats = {f for a in attempts if a["merged"] for f in a["features"]}
    for feat, row in verdicts.items():
        col = t.read(columns=[feat]).column(0) if feat in main_cols else None
        row["values_on_main"] = len(col) - col.null_count if col is not None else 0
        if feat in merged_feats:
            row["outcome"] = "merged into main"
        else:
            row["outcome"] = "blocked" + ("; column retired" if feat in retired.split(", ") else "")
        out[f"candidate {feat}"] = row
    out["attempts"] = attempts  # structured, left out of the printed report
    return out


def _observed_cells(kind: str, obs: dict) -> dict[str, Any]:
    if kind == "null_fraction":
        return {"null_fraction": obs.get("null_fraction")}
    if kind == "value_range":
        lo, hi = obs.get("min"), obs.get("max")
        return {"range": f"[{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else "-"}
    if kind == "distinct_count":
        return {"distinct": obs.get("distinct")}
    if kind == "drift":
        return {"drift_ks": obs.get("ks")}
    return {}


def run_targets(lake, context: dict, targets=DEMO_TARGETS) -> Optional[dict]:
    """Materialize ``target_labels`` for each target; one row per target."""
    from assets import label_targets
    from platform_defs.runs import run_job
    from resources import LakeResource

    if not _ready(lake, context):
        return None
    from assets.main import SAMPLES_TABLE

    resource = {"lake": LakeResource(home=str(context["home"]))}
    t = lake.table(SAMPLES_TABLE)
    main_before = t.branches()["main"]
    instance = _instance(context)
    out: dict[str, Any] = {}
    try:
        instance.add_dynamic_partitions(label_targets.target_partitions.name, list(targets))
        for name in targets:
            started = time.perf_counter()
            result = run_job(label_targets.labels_job.name, instance, resource, partition_key=name,
                             run_config=QUIET, tags=TAGS, raise_on_error=False)
            md = _materialized(result, "target_labels")
            if md is None:
                out[f"target {name}"] = {"branch": label_targets.BRANCH_PREFIX + name, "status": "FAILED"}
                continue
            out[f"target {name}"] = {
                "branch": md["branch"],
                "columns": md["columns"],
                "rows_labelled": md["rows_labelled"],
                "positive_rate": md["positive_rate"],
                "update_files": md["update_files"],
                "bytes_written": md["bytes_written"],
                "exclusive_bytes": md["exclusive_bytes"],
                "shared_bytes": md["shared_bytes"],
                "main_unchanged": md["main_unchanged"],
                "run_s": round(time.perf_counter() - started, 2),
            }
    finally:
        instance.dispose()
    main_after = t.branches()["main"]
    out = {
        "targets": ", ".join(targets),
        "main snapshot": f"{main_before} -> {main_after} "
        f"({'unchanged' if main_before == main_after else 'MOVED'})",
        **out,
    }
    return out


def storage_per_branch(lake, context: dict) -> Optional[dict]:
    """Every branch of ml.samples: rows, files, and bytes owned alone vs shared with other refs."""
    from assets.main import SAMPLES_TABLE

    if SAMPLES_TABLE not in lake.tables():
        return None
    t = lake.table(SAMPLES_TABLE)
    out: dict[str, dict] = {}
    for branch in t.branches():
        s = t.stats(branch)
        row = {
            "rows": int(s.get("rows", 0)),
            "update_files": int(s.get("update_files", 0)),
            "exclusive_bytes": int(s.get("exclusive_bytes", 0)),
            "shared_bytes": int(s.get("shared_bytes", 0)),
        }
        total = row["exclusive_bytes"] + row["shared_bytes"]
        row["exclusive_ratio"] = round(row["exclusive_bytes"] / total, 4) if total else 0.0
        out[branch] = row
    return out


__all__ = ["run_research", "run_targets", "storage_per_branch", "DEMO_BRANCH", "DEMO_TARGETS"]
