"""TeardownStack's constructs, named for the stack as stacks/train/ and stacks/preprocess/ are:
the run controller that keeps a run going and ends its bill (it relaunches, reboots and replaces
nodes, and deletes TrainStack at the run's end, idle or hard cap), the deploy-time answers and the
guards it hands the stacks it watches. The functions' code is the controller package
(controller/); this folder only declares them.

    stack.py             TeardownStack: the run controller, the deploy-time answers, the
                         preprocessing node's stop, the failure alarms and mail, the optional budget
    run_controller.py    RunController: the tick (every minute, and at once on every trigger's
                         rule), the workflow of its long actions (workflow.py) and its steps'
                         functions, the cleanup that answers TrainStack's Replacements resource
    controller_policy.py what each of the controller's roles may do, and on what
    controller_cost.py   what the controller costs a month, for synthesis's estimate
    workflow.py          RunWorkflow: the run controller's Step Functions state machine
    functions.py         the Lambda functions, all made alike from controller/'s two assets
    deploy_answers.py    the deploy-time answers' function (controller/answers.py), read-only
    answered.py          a custom resource that TeardownStack's functions answer
    failure_mail.py      the failure alarms' e-mail (-c notifyEmail)
    guards.py            FleetGuards: what the guarded stacks take from this one
    run_guard.py         RunGuard (inside TrainStack): the run's hard cap and idle alarm
    preprocess_guard.py  PreprocessGuard (inside PreprocessStack): registers the preprocessing
                         instance and grants its stop exactly that instance and volume

Both guards live in the dependent stacks, so TeardownStack never references them and there is
no dependency cycle. They reference the tick (and the dead-letter queue) strongly, through
CloudFormation exports: CloudFormation refuses to delete TeardownStack while TrainStack or
PreprocessStack imports them, so the cap schedule and the alarm never point at a function that
is gone. The stack keeps its name, TeardownStack: a deployed stack renamed would be a new stack
beside the old one.
"""
