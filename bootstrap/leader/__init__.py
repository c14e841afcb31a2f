"""What only the leader (node 0) runs: Leader, horovodrun and its stall watch, the checkpoints,
the failure classifier (pure functions), DONE.json, status.json and the benchmark."""
