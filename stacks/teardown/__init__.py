"""Cost control: the reaper Lambda and the triggers that make a fleet stop billing unattended.

    stack.py             TeardownStack: the reaper, the S3 completion rules, the re-check role,
                         the failure alarms and the optional budget
    run_guard.py         RunGuard (inside TrainStack): the run's hard cap and idle alarm
    preprocess_guard.py  PreprocessGuard (inside PreprocessStack): registers the preprocessing
                         instance and grants the reaper exactly that instance and volume
    names.py             what the reaper, its triggers and the other stacks agree on
    reaper/handler.py    the reaper's runtime, the Lambda asset TeardownStack deploys

Both guards live in the dependent stacks, so TeardownStack never references them and there is
no dependency cycle. They reference the reaper (and its dead-letter queue) strongly, through
CloudFormation exports: CloudFormation refuses to delete TeardownStack while TrainStack or
PreprocessStack imports them, so the cap schedule and the alarm never point at a reaper that is
gone.
"""
