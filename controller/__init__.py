"""The run controller: what TeardownStack's functions run (stacks/teardown/). It reads the whole
run every minute and takes the next step, as AWS ParallelCluster's clustermgtd reads its fleet.

    tick.py            the tick: observe, decide the guards, read the records, decide, act
      observe.py       what it reads of the run (the world, then the run's records)
      snapshot.py      what it read, typed: the Snapshot decide.py and act.py take
      decide_guards.py the guards, decided before any record is read (a delete, the cap, a
                       hold, the idle fleet)
      decide.py        the run's phase and its next actions, from the snapshot alone (pure)
      long_actions.py  the long actions (the workflow's executions) as their executions say
      judge.py         the rules decide.py composes, each a pure function
      replace.py       a lost node of the elastic fleet replaced while its head trains on
      recovery.py      an attempt's end: relaunch, teardown or stop, on its cause alone
      actions.py       the actions decide.py lists and act.py takes, typed, and the Verdict
      act.py           the actions, each idempotent
    steps.py, steps_fleet.py, steps_teardown.py
                       the states of the workflow the tick starts (stacks/teardown/workflow.py)
    cleanup.py         TrainStack's Replacements resource: the launched nodes ended on its delete
    preprocess.py      the preprocessing node's stop (a function of its own, not the controller)
    answers.py         the deploy-time answers (a read-only function of their own), with
      run_answers.py   the image's, the run check's and the run record's, and
      answer_kit.py    what they share (clients, clock, log, the refusal, the rollback)
    train_stack.py, ec2_fleet.py, executions.py, records.py, zones.py, notify.py, clients.py
                       TrainStack, its instances, the executions, the run's records in S3, the
                       zones, the mail, and what every function shares (clients, clock, log)

Only boto3, the standard library and contract/. Lambda names a handler `<module>.<function>`
of its asset's top level: each asset (stacks/teardown/functions.py) holds this package, contract/
and, for each module whose functions are handlers, a top-level module of the same name that
imports them from here, so handler `tick.handler` runs controller.tick.handler.
"""
