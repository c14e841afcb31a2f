"""A node's own failure, told to the head (bootstrap/fleet/node_failures.py)."""

import time

import pytest

from bootstrap.fleet import node_failures


def test_the_head_reads_this_attempts_failures_and_ends_on_the_ones_it_is_told_to(s3, train_config):
    head = train_config(role="head", nodes=3)
    started = time.time()
    node_failures.write(s3, train_config(node_index=1, nodes=3), "10.0.0.6", "i-1", "node_unhealthy",
                        "step 'health' failed: HealthError: 7 GPUs", started - 600)  # fmt: skip
    lines = []
    watch = node_failures.Watch(
        head, s3, since=started, ends=lambda doc: doc["cause"] == "corrupt_shard", log=lines.append
    )
    watch.check()  # an earlier attempt's record is history
    node_failures.write(s3, train_config(node_index=2, nodes=3), "10.0.0.7", "i-2", "node_unhealthy",
                        "step 'health' failed: HealthError: 7 GPUs", started + 1)  # fmt: skip
    watch.check()  # reported, but it does not end the attempt (an elastic reset absorbs it)
    assert lines == [
        "node 2 (i-2, 10.0.0.7) reported: step 'health' failed: HealthError: 7 GPUs (cause "
        "node_unhealthy)"
    ]
    ended = []
    watch.on_end = lambda: ended.append(True)
    node_failures.write(s3, train_config(node_index=0, nodes=3), "10.0.0.5", "i-0", "corrupt_shard",
                        "step 'data pull' failed: VerificationError: sha256", started + 2)  # fmt: skip
    with pytest.raises(node_failures.NodeFailed) as failed:
        watch.check()
    assert (failed.value.cause, ended) == ("corrupt_shard", [True])
    assert str(failed.value) == (
        "node 0 (i-0, 10.0.0.5) failed: step 'data pull' failed: VerificationError: sha256"
    )
    with pytest.raises(node_failures.NodeFailed):
        watch.check()  # it stays ended
    assert ended == [True]
