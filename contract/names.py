"""The names the stacks, the run controller, the nodes, `horovod-fleet` and the rehearsal agree
on: what the stacks are called, what TrainStack outputs and how it and its instances are tagged,
the deploy-time answers' resource types, and the names made per run (docs/contracts.md,
"Names"). Renaming one renames a deployed resource or hides a live fleet from the controller.
"""

PROJECT = "horovod-fleet"
PROJECT_TAG = "Project"  # = PROJECT on everything the app makes

# The stacks, by their fixed names.
DATASET_STACK = "DatasetStack"
TEARDOWN_STACK = "TeardownStack"
PREPROCESS_STACK = "PreprocessStack"
IMAGE_STACK = "ImageStack"
TRAIN_STACK = "TrainStack"  # the only stack the run controller may ever delete
STACKS = (TRAIN_STACK, PREPROCESS_STACK, IMAGE_STACK, TEARDOWN_STACK, DATASET_STACK)

# TrainStack's outputs the run controller and `horovod-fleet` read. They exist only once a create
# has finished: the controller reads what it needs before that from the stack's tags (below).
RUN_OUTPUT_KEY = "HorovodFleetRun"
# The run's notification topic (-c notifyEmail), mailed when the controller ends a fleet.
NOTIFY_OUTPUT_KEY = "NotifyTopic"
# How many relaunches, and the hard cap's time.
MAX_RESTARTS_OUTPUT_KEY = "HorovodFleetMaxRestarts"
DEADLINE_OUTPUT_KEY = "HorovodFleetDeadline"
# The one launch template every replacement node is launched from.
REPLACEMENT_OUTPUT_KEY = "HorovodFleetReplacementTemplate"
# ... and the one the head is launched again from when EC2 ended it.
HEAD_TEMPLATE_OUTPUT_KEY = "HorovodFleetHeadTemplate"
# How many nodes the fleet has: the indexes a relaunch brings back.
NODES_OUTPUT_KEY = "HorovodFleetNodes"
# The fewest nodes the elastic fleet trains on: the controller replaces a lost node while at
# least this many train, and leaves fewer to the head's end of the attempt.
MIN_NODES_OUTPUT_KEY = "HorovodFleetMinNodes"
# The zones TrainStack made a subnet and a cluster placement group in, the deployed one first:
# where a relaunch may launch the fleet.
ZONES_OUTPUT_KEY = "HorovodFleetZones"

# TrainStack's stack-level tags, which CloudFormation holds from CreateStack on: the run, how many
# nodes, how stale a node's heartbeat may be, how long an attempt's nodes get to start before
# silence counts. Only values that cannot change while a fleet lives.
RUN_TAG = "horovod-fleet:run"  # also on everything TrainStack makes
NODES_TAG = "horovod-fleet:nodes"
HEARTBEAT_TAG = "horovod-fleet:heartbeatTimeoutS"
STARTUP_GRACE_TAG = "horovod-fleet:startupGraceS"

# Every fleet instance, the first and its replacements, carries these: the id of the stack it
# belongs to (the controller may stop, start and terminate only such instances) and its node.
FLEET_TAG = "horovod-fleet:stack"
NODE_TAG = "horovod-fleet:node"
HEAD_NODE = "head"  # the head's NODE_TAG value: a fleet instance with no node index
# A drill's training nodes also carry this, so that its FIS experiments can aim at a node of the
# fleet and never its head (stacks/train/drill.py): NODE_TAG's values are the nodes' indexes.
ROLE_TAG = "horovod-fleet:role"
TRAIN_ROLE = "train"
# The preprocessing stop's snapshot of the data volume: the manifest's ETag it was taken after.
MANIFEST_TAG = "horovod-fleet:manifest"

# The custom resources TeardownStack's functions answer. The cleanup answers Replacements: on
# the stack's delete it terminates the instances the controller launched, which CloudFormation
# does not know, before their interfaces hold up the delete.
REPLACEMENTS_TYPE = "Custom::HorovodFleetReplacements"
# The deploy-time answers (read only): the hard cap's time, counted from the first deploy ...
DEADLINE_TYPE = "Custom::HorovodFleetDeadline"
# ... an AMI id and code URLs as they were on the first deploy, kept by every update ...
PINNED_TYPE = "Custom::HorovodFleetPinned"
# ... SUCCESS only when the fleet's dataset manifest exists in S3 ...
DATASET_TYPE = "Custom::HorovodFleetDataset"
# ... a zone of the region that offers the fleet's instance type ...
ZONE_TYPE = "Custom::HorovodFleetZone"
# ... and the refusal of a deploy that would change what a live fleet's nodes run.
CODE_GUARD_TYPE = "Custom::HorovodFleetCodeGuard"
# ... the image ImageStack baked, or a one-line refusal while it bakes or before any is ...
IMAGE_TYPE = "Custom::HorovodFleetImage"
# ... a redeploy of a run with other training values refused unless -c allowChange=true ...
RUN_CHECK_TYPE = "Custom::HorovodFleetRunCheck"
# ... and runs/<run>/config.json written: every context value of the deploy.
RUN_RECORD_TYPE = "Custom::HorovodFleetRunRecord"
# ImageStack's outputs TrainStack's image check reads (docs/contracts.md).
AMI_OUTPUT_KEY = "AmiId"
IMAGE_VERSION_OUTPUT_KEY = "ImageVersion"

# Names made per run, <prefix><run>: the run's notification topic (the controller may publish to
# these only), the hard cap's one-time schedule (the tick reads its time there while TrainStack
# is still being created) and the idle alarm.
NOTIFY_TOPIC_PREFIX = "horovod-fleet-notify-"
CAP_SCHEDULE_PREFIX = "horovod-fleet-cap-"
IDLE_ALARM_PREFIX = "horovod-fleet-idle-"
# The proven training image's AMI id (ImageStack), the one TrainStack boots.
IMAGE_PARAMETER = "/horovod-fleet/training-ami"
# PreprocessGuard writes the preprocessing instance and volume here; the preprocessing stop
# reads it.
PREPROCESS_PARAMETER = "/horovod-fleet/preprocess"
# The nodes' CloudWatch agent publishes GPU utilisation here; the idle alarm watches it.
METRIC_NAMESPACE = "HorovodFleet"

# A fleet is idle after IDLE_EVALUATION_PERIODS periods of IDLE_PERIOD_MINUTES below the alarm's
# threshold: the alarm's window, and the one the tick judges an idle fleet by.
IDLE_PERIOD_MINUTES = 5
IDLE_EVALUATION_PERIODS = 6
IDLE_MINUTES = IDLE_PERIOD_MINUTES * IDLE_EVALUATION_PERIODS
# How often the controller replaces one node index within an attempt before it leaves the fleet
# smaller; the head's reset limit allows for every such loss and join.
REPLACEMENTS_PER_NODE = 2
