"""The fault rows of the fleet's processes and hosts: ranks killed or paused, nodes and the head
lost, the elastic resets and replacements, Spot's notices."""

from __future__ import annotations

import re

from rehearsal.fault_actions import (
    cut_network,
    forget_node,
    kill_fleet_for,
    kill_head_and_its_instance,
    kill_head_bootstrap,
    kill_host,
    kill_host_for,
    kill_host_then_its_replacement,
    kill_rank,
    pause_host,
    pause_rank,
    spot_notice,
    stop_node,
    wait_for_fault_threads,
)
from rehearsal.fault_checks import (
    a_new_head_took_over,
    decisions,
    every_attempt_counted,
    every_node_back_in_place_with_nothing_fetched,
    first_attempt_ended,
    head_said,
    interruption_named,
    left_with_no_step_redone,
    lost_in_a_reset,
    lost_joiner_named,
    no_epoch_retrained,
    node_said,
    one_attempt,
    only_node_replaced,
    replacement_joined,
    the_controller_wrote_the_silence,
    trainer_kept_its_pid,
    training_again_within,
    waited_for_the_head,
)
from rehearsal.fault_row import (
    DATASET,
    DEAD_FOR_S,
    ELASTIC,
    ELASTIC_NODES,
    ELASTIC_TIMEOUT_S,
    EPOCH_DONE,
    EVERY_EPOCH,
    FIRST_OF_FOUR_DONE,
    HEAD_PAUSE_S,
    LOSS_SEEN_S,
    MISSING_NODE_TIMEOUT_S,
    PAUSE_S,
    REPLACEMENT_LOST_AFTER_S,
    SECOND_OF_FOUR_DONE,
    Expect,
    Fault,
    Request,
    Row,
)

RANK_ROWS = [
    Row(
        "ranks",
        "rank 1 killed (SIGKILL)",
        "a reset without node 1 (its host out for its cooldown, then back); succeeded with "
        "every epoch, attempt 1",
        DATASET,
        3,
        Fault(kill_rank(1), when="Epoch 2/"),
        Expect(
            "succeeded",
            3,
            {"one_attempt": one_attempt, "reset_without_node_1": lost_in_a_reset(1)},
        ),
        max_restarts=2,
    ),
    Row(
        "ranks",
        "the head's bootstrap killed (SIGKILL) after its first checkpoint",
        "systemd restarts it; it resumes from S3 and the run succeeds with every epoch",
        DATASET,
        3,
        Fault(kill_head_bootstrap, when="is in s3://"),
        Expect(
            "succeeded",
            3,
            {
                "restarted_once": lambda r, d: r.restarts.get("head") == 1,
                "resumed": lambda r, d: head_said(r, "Resuming from"),
                "nodes_saw_done": lambda r, d: node_said(r, 1, "DONE.json is written"),
            },
        ),
        EVERY_EPOCH,
    ),
    Row(
        "ranks",
        f"rank 1's trainer paused (SIGSTOP) for {PAUSE_S} s, past the 30 s collective timeout",
        "the others' collective times out and they reset; the paused rank rejoins once it runs "
        "again; succeeded with every epoch, attempt 1",
        DATASET,
        3,
        Fault(pause_rank(1, PAUSE_S), when=EPOCH_DONE),
        Expect(
            "succeeded",
            3,
            {"one_attempt": one_attempt, "a_reset": lambda r, d: bool(d.get("resets"))},
        ),
        max_restarts=2,
    ),
]

NODE_ROWS = [
    Row(
        "nodes",
        "node 0 stopped (SIGTERM: its shutdown) after an epoch",
        "its ranks leave at the next commit and the others train on; succeeded with every "
        "epoch, attempt 1",
        DATASET,
        3,
        Fault(stop_node(0), when=EPOCH_DONE),
        Expect("succeeded", 3, {"one_attempt": one_attempt, "left": lost_in_a_reset(0)}),
        max_restarts=2,
        needs_hosts=True,
    ),
    Row(
        "nodes",
        "node 1 never boots (maxRestarts 1)",
        "failed: node(s) 1 of 2 did not register, named every 30 s; relaunched once, then "
        "stopped: restarts exhausted",
        DATASET,
        2,
        Fault(forget_node(1)),
        Expect(
            "failed",
            checks={
                "names_the_node": lambda r, d: "node(s) 1 of 2 did not register" in d["reason"],
                "said_so_every_30_s": lambda r, d: (
                    sum(
                        "rendezvous: waiting" in line and "node(s) 1 of 2" in line
                        for line in r.output.get("head", [])
                    )
                    >= 2
                ),
                "relaunched_once_then_stopped": decisions("relaunch", "stop"),
                "says_restarts_exhausted": lambda r, d: (
                    "restarts exhausted" in r.entries[-1]["why"]
                ),
            },
        ),
        {"absent": (1,), "rendezvous_timeout_s": MISSING_NODE_TIMEOUT_S},
        max_restarts=1,
    ),
    Row(
        "nodes",
        f"the head's host dead for {DEAD_FOR_S} s after an epoch",
        "the nodes find the head lost and write the attempt's DONE.json (node_lost); relaunched, "
        "succeeded with every epoch, DONE.json counts 2 attempts",
        DATASET,
        3,
        Fault(kill_host_for("head", DEAD_FOR_S), when=EPOCH_DONE),
        Expect(
            "succeeded",
            3,
            {
                "a_node_recorded_the_lost_head": first_attempt_ended("node_lost", "the head"),
                "relaunched_once": decisions("relaunch", "teardown"),
                "counted": every_attempt_counted,
            },
        ),
        EVERY_EPOCH,
        max_restarts=2,
        before_relaunch=wait_for_fault_threads,
        needs_hosts=True,
        # Not in CI's subset: CI's upload-cut row loses the head's host too, and relaunches.
    ),
    Row(
        "nodes",
        f"every node's host and the head's dead for {DEAD_FOR_S} s right after epoch 2 of 4 "
        "(the whole fleet silent)",
        "no node can write DONE.json; the run controller finds every heartbeat stale, writes the "
        "attempt's record (node_lost, naming every node) and relaunches, every node and the head "
        "rebooted in place (each pull fetches 0 bytes); succeeded with every epoch",
        DATASET,
        4,
        Fault(kill_fleet_for(DEAD_FOR_S), when=SECOND_OF_FOUR_DONE),
        Expect(
            "succeeded",
            4,
            {
                "the_controller_wrote_it": the_controller_wrote_the_silence,
                "back_in_place_fetching_nothing": every_node_back_in_place_with_nothing_fetched,
            },
        ),
        max_restarts=2,
        before_relaunch=wait_for_fault_threads,
        needs_hosts=True,
    ),
    Row(
        "nodes",
        "the head's host lost and its instance terminated in EC2 after epoch 1 of 4 (once its "
        "checkpoint is committed)",
        "the nodes find the head lost and write the attempt's DONE.json (node_lost); the run "
        "controller launches a new head from its template and reboots the nodes in place; the "
        "new head resumes from S3 at epoch 2 and the run succeeds with 4 epochs, no deploy",
        DATASET,
        4,
        Fault(
            kill_head_and_its_instance,
            when=Request("PUT", re.compile(r"/runs/[^/]+/model/checkpoints/checkpoint$")),
        ),
        Expect(
            "succeeded",
            4,
            {
                "a_node_recorded_the_lost_head": first_attempt_ended("node_lost", "the head"),
                "relaunched_once": decisions("relaunch", "teardown"),
                "a_new_head_took_over": a_new_head_took_over,
                "resumed_at_epoch_2": no_epoch_retrained(2),
            },
        ),
        {
            "heartbeat_timeout_s": LOSS_SEEN_S,
            "trainer": {"image_size": 64, "checkpoint_every_s": 1},
        },
        max_restarts=2,
        needs_hosts=True,
        nodes=ELASTIC_NODES,
    ),
]

ELASTIC_ROWS = [
    Row(
        "elastic",
        "node 2's host lost right after epoch 1 of 4 (every process SIGKILLed)",
        "a reset on nodes 0 and 1, node 0's trainer the same process; the run controller "
        "replaces node 2, which joins before the end; succeeded with 4 epochs, attempt 1",
        DATASET,
        4,
        Fault(kill_host(2, then=SECOND_OF_FOUR_DONE), when=FIRST_OF_FOUR_DONE),
        Expect(
            "succeeded",
            4,
            {
                "one_attempt": one_attempt,
                "reset_without_node_2": lost_in_a_reset(2),
                "node_0_kept_its_trainer": trainer_kept_its_pid(0),
                "replacement_joined": replacement_joined(2),
            },
        ),
        ELASTIC,
        max_restarts=2,
        needs_hosts=True,
        # In CI: a reset and the run controller's tick replacing a node while the head trains
        # on; it stands for the tick's path, so the whole fleet silent row left CI.
        in_ci=True,
        nodes=ELASTIC_NODES,
    ),
    Row(
        "elastic",
        "node 0's host lost right after epoch 1 of 4 (rank 0's node)",
        "a reset on nodes 1 and 2 (rank 0 moves; the head copies its outputs from there); "
        "succeeded with 4 epochs, attempt 1",
        DATASET,
        4,
        Fault(kill_host(0), when=FIRST_OF_FOUR_DONE),
        Expect("succeeded", 4, {"one_attempt": one_attempt, "reset": lost_in_a_reset(0)}),
        ELASTIC,
        max_restarts=2,
        needs_hosts=True,
        nodes=ELASTIC_NODES,
    ),
    Row(
        "elastic",
        "node 1's link down for good right after epoch 1 of 4 (a silent loss)",
        "the others train again within 120 s (Gloo's 30 s timeout, ssh keep-alives); the run "
        "controller replaces node 1; succeeded with 4 epochs, attempt 1",
        DATASET,
        4,
        Fault(cut_network(1), when=FIRST_OF_FOUR_DONE),
        Expect(
            "succeeded",
            4,
            {"one_attempt": one_attempt, "within_120_s": training_again_within(1, 120)},
        ),
        ELASTIC,
        max_restarts=2,
        needs_hosts=True,
        nodes=ELASTIC_NODES,
    ),
    Row(
        "elastic",
        f"node 2's host lost right after epoch 1 of 4, then its replacement's processes killed "
        f"{REPLACEMENT_LOST_AFTER_S} s after its launch",
        "the replacement is listed only once its heartbeat is steady and the head reaches it "
        "(lost in its join, horovodrun starts again on nodes 0 and 1); the record names node 2, "
        "never node 1; succeeded with 4 epochs, attempt 1",
        DATASET,
        4,
        Fault(kill_host_then_its_replacement(2, REPLACEMENT_LOST_AFTER_S), when=FIRST_OF_FOUR_DONE),
        Expect(
            "succeeded",
            4,
            {"one_attempt": one_attempt, "names_node_2_only": lost_joiner_named(2)},
        ),
        ELASTIC,
        max_restarts=2,
        needs_hosts=True,
        nodes=ELASTIC_NODES,
    ),
    Row(
        "elastic",
        f"every process of the head's host paused (SIGSTOP) for {HEAD_PAUSE_S} s right after "
        "epoch 1 of 4 (a stalled head)",
        "the nodes see its heartbeat stale but their ranks step: they wait, none writes "
        "DONE.json; the head runs again and the run succeeds with 4 epochs, attempt 1",
        DATASET,
        4,
        Fault(pause_host("head", HEAD_PAUSE_S), when=FIRST_OF_FOUR_DONE),
        Expect(
            "succeeded", 4, {"one_attempt": one_attempt, "waited_for_the_head": waited_for_the_head}
        ),
        ELASTIC,
        max_restarts=2,
        needs_hosts=True,
        nodes=ELASTIC_NODES,
    ),
    Row(
        "elastic",
        "fewer than minNodes left: node 1's host lost with minNodes 2 of 2",
        f"the head's driver waits {ELASTIC_TIMEOUT_S} s for minNodes, then the attempt ends "
        "node_lost (fewer than minNodes); relaunched, succeeded with every epoch",
        DATASET,
        3,
        Fault(kill_host(1), when=EPOCH_DONE),
        Expect(
            "succeeded",
            3,
            {
                "ended_below_min_nodes": first_attempt_ended(
                    "node_lost", "fewer than minNodes (2)"
                ),
                "relaunched_once": decisions("relaunch", "teardown"),
            },
        ),
        {**EVERY_EPOCH, "min_nodes": 2, "elastic_timeout_s": ELASTIC_TIMEOUT_S},
        max_restarts=2,
        needs_hosts=True,
    ),
]

SPOT_ROWS = [
    Row(
        "Spot",
        "Spot interruption of node 1 (two-minute notice) after an epoch",
        "node 1 leaves at the next commit with no step redone, the others train on; succeeded "
        "with every epoch, attempt 1",
        DATASET,
        3,
        Fault(spot_notice(1), when=EPOCH_DONE),
        Expect(
            "succeeded",
            3,
            {"one_attempt": one_attempt, "no_step_redone": left_with_no_step_redone(1)},
        ),
        {**EVERY_EPOCH, "market": "spot"},
        max_restarts=2,
        in_ci=True,
    ),
    Row(
        "Spot",
        "Spot interruption of node 1 with minNodes 2 of 2 (fewer would be left)",
        "attempt 1 interrupted: Spot interruption of node 1 (...): every rank stopped at one "
        "step with its checkpoint; relaunched, node 1 (its notice on record) on a new instance "
        "and node 0 rebooted in place; resumed, succeeded with every epoch",
        DATASET,
        3,
        Fault(spot_notice(1), when=EPOCH_DONE),
        Expect(
            "succeeded",
            3,
            {
                "attempt_1_names_node_1": interruption_named(1),
                "relaunched_once": decisions("relaunch", "teardown"),
                "counted": every_attempt_counted,
                "node_1_replaced_node_0_in_place": only_node_replaced(1),
            },
        ),
        {**EVERY_EPOCH, "market": "spot", "min_nodes": 2},
        max_restarts=2,
    ),
]
