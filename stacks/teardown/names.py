"""Names and limits the run controller (controller/*.py: some from its environment, the others
kept equal by tests/stacks/test_run_controller_stack.py), its triggers and the stacks that
deploy them agree on."""

from aws_cdk import Duration

TRAIN_STACK_NAME = "TrainStack"
# PreprocessGuard writes the instance and volume here; the preprocessing stop reads it.
PREPROCESS_PARAMETER = "/horovod-fleet/preprocess"
# The controller reads the deployed fleet's run from this TrainStack output before it acts.
RUN_OUTPUT_KEY = "HorovodFleetRun"
# ... and the run's notification topic (-c notifyEmail), mailed when the guard ends a fleet.
NOTIFY_OUTPUT_KEY = "NotifyTopic"
# TrainStack's outputs the run controller reads: how many relaunches, and the hard cap's time.
MAX_RESTARTS_OUTPUT_KEY = "HorovodFleetMaxRestarts"
DEADLINE_OUTPUT_KEY = "HorovodFleetDeadline"
# ... and the one launch template every replacement node is launched from.
REPLACEMENT_OUTPUT_KEY = "HorovodFleetReplacementTemplate"
# ... and the one the head is launched again from when EC2 ended it.
HEAD_TEMPLATE_OUTPUT_KEY = "HorovodFleetHeadTemplate"
# ... and how many nodes the fleet has: the indexes a relaunch brings back.
NODES_OUTPUT_KEY = "HorovodFleetNodes"
# ... and the fewest nodes the elastic fleet trains on: the controller replaces a lost node
# while at least this many train, and leaves fewer to the head's end of the attempt.
MIN_NODES_OUTPUT_KEY = "HorovodFleetMinNodes"
# How often the controller replaces one node index within an attempt before it leaves the
# fleet smaller; the head's reset limit allows for every such loss and join.
REPLACEMENTS_PER_NODE = 2
# ... and the zones TrainStack made a subnet and a cluster placement group in, the deployed one
# first: where a relaunch may launch the fleet (controller/zones.py, docs/contracts.md).
ZONES_OUTPUT_KEY = "HorovodFleetZones"
# Every fleet instance, the first and its replacements, carries these: the id of the stack it
# belongs to (the controller may stop, start and terminate only such instances) and its index.
FLEET_TAG = "horovod-fleet:stack"
NODE_TAG = "horovod-fleet:node"
HEAD_NODE = "head"  # the head's NODE_TAG value: a fleet instance with no node index
# A drill's training nodes also carry this, so that its FIS experiments can aim at a node of the
# fleet and never its head (stacks/train/drill.py): NODE_TAG's values are the nodes' indexes.
ROLE_TAG = "horovod-fleet:role"
TRAIN_ROLE = "train"
# The controller's cleanup answers this one: on the stack's delete it terminates the instances
# it launched, which CloudFormation does not know, before their interfaces hold up the delete.
REPLACEMENTS_TYPE = "Custom::HorovodFleetReplacements"
NOTIFY_TOPIC_PREFIX = "horovod-fleet-notify-"
# The hard cap's one-time schedule of a run is named this and the run: the tick reads its time
# there while TrainStack is still being created (it has no outputs yet).
CAP_SCHEDULE_PREFIX = "horovod-fleet-cap-"
IDLE_ALARM_PREFIX = "horovod-fleet-idle-"
# The deploy-time answers (answers/answers.py, read only): the hard cap's time, counted from the
# first deploy ...
DEADLINE_TYPE = "Custom::HorovodFleetDeadline"
# ... an AMI id and code URLs as they were on the first deploy, kept by every update ...
PINNED_TYPE = "Custom::HorovodFleetPinned"
# ... SUCCESS only when the fleet's dataset manifest exists in S3 ...
DATASET_TYPE = "Custom::HorovodFleetDataset"
# ... and a zone of the region that offers the fleet's instance type.
ZONE_TYPE = "Custom::HorovodFleetZone"
# ... and refuses a deploy that would change what a live fleet's nodes run (train/code_guard.py).
CODE_GUARD_TYPE = "Custom::HorovodFleetCodeGuard"
# The nodes' CloudWatch agent publishes GPU utilisation here; the idle alarm watches it.
METRIC_NAMESPACE = "HorovodFleet"
IDLE_PERIOD = Duration.minutes(5)
IDLE_EVALUATION_PERIODS = 6  # 6 x 5 min = 30 minutes below the threshold
IDLE_MINUTES = int(IDLE_PERIOD.to_minutes()) * IDLE_EVALUATION_PERIODS  # quiet this long is idle
