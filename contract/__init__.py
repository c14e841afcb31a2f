"""What the rooms of horovod-fleet agree on, written once: the stacks (stacks/), the run
controller (controller/), the nodes' bootstrap (bootstrap/), `horovod-fleet` (watch/) and the
rehearsal all import it, and meet at these names only (docs/contracts.md says what each means).

    names.py    the stacks' names, TrainStack's outputs and tags, the instances' tags, the
                custom resources' types, the names given per run (topics, schedules, alarms)
    causes.py   why an attempt ended, as a code, and what the run controller does on each
    runs.py     the keys under runs/<run>/ and the time stamps of their documents
    records.py  the shapes of status.json, DONE.json, attempts.json, controller.json, hold.json
    fleet.py    minNodes' default and the four guards that hold it
    drill.py    the drill's experiments: one list, played by AWS FIS and by the rehearsal

The standard library only, and nothing of the project: a leaf every room may import. It ships
inside each code asset whose code imports it (stacks/staging.py). trainer/ does not import it:
trainer/ is also the training image's proof code, fetched alone into the image
(docs/layout.md).
"""
