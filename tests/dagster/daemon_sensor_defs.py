"""A code location for the sensor-daemon test: the real compaction sensor, job and asset.

Loaded in process by the Dagster sensor daemon's own tick code
(tests/dagster/test_maintenance_dagster.py); the lake is FEATURELAKE_HOME at run time.
Thresholds are those of the test module; the sensor runs from the start.
"""
from dagster import DefaultSensorStatus, Definitions, in_process_executor

from assets import maintenance as maintenance_group
from platform_defs.sensors import compaction_job, compaction_sensor
from resources import LakeResource

SENSOR = "daemon_compaction_sensor"

defs = Definitions(
    assets=[maintenance_group.compaction],
    jobs=[compaction_job],
    sensors=[
        compaction_sensor(
            SENSOR, min_small_files=4, min_update_layers=2, min_update_files=0,
            minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
        )
    ],
    resources={"lake": LakeResource()},  # FEATURELAKE_HOME, read when the lake is used
    executor=in_process_executor,  # a step in a subprocess costs seconds
)
