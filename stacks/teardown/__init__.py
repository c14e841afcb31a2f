"""Cost control: the run controller and the triggers that make a fleet stop billing unattended.

    stack.py             TeardownStack: the run controller, the deploy-time answers, the
                         preprocessing node's stop, the failure alarms and the optional budget
    run_controller.py    RunController: the tick (every minute, and at once on every trigger's
                         rule), the workflow of its long actions (workflow.py) and its steps'
                         functions, the cleanup that answers TrainStack's Replacements resource
    controller_policy.py what each of the controller's roles may do, and on what
    workflow.py          RunWorkflow: the run controller's Step Functions state machine
    deploy_answers.py    the deploy-time answers' function (controller/answers.py), read-only
    run_guard.py         RunGuard (inside TrainStack): the run's hard cap and idle alarm
    preprocess_guard.py  PreprocessGuard (inside PreprocessStack): registers the preprocessing
                         instance and grants its stop exactly that instance and volume
    answered.py          a custom resource that TeardownStack's functions answer
    controller/          the run controller's Lambda asset: the tick (tick.py: observe.py,
                         decide.py, judge.py, replace.py, act.py), the steps (steps*.py) and
                         the modules they share, the cleanup, the preprocessing stop

Both guards live in the dependent stacks, so TeardownStack never references them and there is
no dependency cycle. They reference the tick (and the dead-letter queue) strongly, through
CloudFormation exports: CloudFormation refuses to delete TeardownStack while TrainStack or
PreprocessStack imports them, so the cap schedule and the alarm never point at a function that
is gone.
"""
