"""Names and limits the reaper (reaper/handler.py reads them from its environment), its triggers
and the stacks that deploy the triggers agree on."""

from aws_cdk import Duration

TRAIN_STACK_NAME = "TrainStack"
# PreprocessGuard writes the instance and volume here; the reaper reads it on a new manifest.
PREPROCESS_PARAMETER = "/horovod-fleet/preprocess"
# The reaper reads the deployed fleet's run from this TrainStack output before deleting it.
RUN_OUTPUT_KEY = "HorovodFleetRun"
# ... and the run's notification topic (-c notifyEmail), mailed when the guard ends a fleet.
NOTIFY_OUTPUT_KEY = "NotifyTopic"
# TrainStack's outputs the run controller reads: how many relaunches, and the hard cap's time.
MAX_RESTARTS_OUTPUT_KEY = "HorovodFleetMaxRestarts"
DEADLINE_OUTPUT_KEY = "HorovodFleetDeadline"
# ... and the launch templates of the nodes' replacements, in node order, comma-separated.
REPLACEMENTS_OUTPUT_KEY = "HorovodFleetReplacementTemplates"
# ... and where a fleet without capacity in its zone may move (reaper/zone_move.py); absent when
# the user's subnet or capacity reservation fixes the zone.
ZONE_MOVE_OUTPUT_KEY = "HorovodFleetZoneMove"
# ... and the zones a relaunch may launch the fleet in, each with its subnet and placement group,
# the deployed one first (docs/contracts.md); TrainStack makes them at deploy.
ZONES_OUTPUT_KEY = "HorovodFleetZones"
# The subnets and placement groups the reaper makes for a move carry the zone in this tag.
ZONE_TAG = "horovod-fleet:zone"
# Every fleet instance, the first and its replacements, carries these: the id of the stack it
# belongs to (the reaper may stop, start and terminate only such instances) and its node index.
FLEET_TAG = "horovod-fleet:stack"
NODE_TAG = "horovod-fleet:node"
# The reaper answers this one on Delete: it terminates the replacements it launched, which
# CloudFormation does not know, before their network interfaces hold up the delete.
REPLACEMENTS_TYPE = "Custom::HorovodFleetReplacements"
NOTIFY_TOPIC_PREFIX = "horovod-fleet-notify-"
IDLE_ALARM_PREFIX = "horovod-fleet-idle-"
# The reaper also answers this custom resource: an AMI id and code URLs as they were on the
# first deploy, kept by every update (reaper/handler.py).
PINNED_TYPE = "Custom::HorovodFleetPinned"
# ... and this one: SUCCESS only when the fleet's dataset manifest exists in S3.
DATASET_TYPE = "Custom::HorovodFleetDataset"
# ... and this one: a zone of the region that offers the fleet's instance type.
ZONE_TYPE = "Custom::HorovodFleetZone"
# The nodes' CloudWatch agent publishes GPU utilisation here; the idle alarm watches it.
METRIC_NAMESPACE = "HorovodFleet"
IDLE_PERIOD = Duration.minutes(5)
IDLE_EVALUATION_PERIODS = 6  # 6 x 5 min = 30 minutes below the threshold
IDLE_MINUTES = int(IDLE_PERIOD.to_minutes()) * IDLE_EVALUATION_PERIODS  # quiet this long is idle
