"""The fleet's one rule both sides apply: minNodes, the fewest nodes an elastic reset trains on.

The configuration (stacks/config.py, `-c minNodes`) and the node's reading of node.json
(bootstrap/node_config.py `min_nodes`) default it the same way, here. Four guards hold it, each
ending the attempt as node_lost when fewer nodes are left, none of them waiting longer than the
elastic timeout:
  - horovodrun's own `--min-np` (bootstrap/head/elastic.py elastic_command): after a reset its
    elastic driver waits HOROVOD_ELASTIC_TIMEOUT for minNodes' slots, then gives up;
  - the driver's giving up, read back (bootstrap/head/elastic.py driver_gave_up);
  - the discovery's count when horovodrun ends (bootstrap/head/elastic.py too_few_left);
  - the head's count before it starts horovodrun again in place (bootstrap/head/head.py).
"""


def default_min_nodes(nodes: int) -> int:
    """minNodes when none is given: a node's loss leaves the rest training (one node: itself)."""
    return max(1, nodes - 1)
