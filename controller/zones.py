"""Where and when a relaunch tries to bring the fleet back: zone by zone, round by round.

A cluster placement group "can't span multiple Availability Zones" and EFA traffic stays in one
zone, so the whole fleet goes to one zone per try
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-groups.html). TrainStack makes a
subnet and a cluster placement group in every zone that offers the type when it is deployed,
and names them in its output `contract.names.ZONES_OUTPUT_KEY` (docs/contracts.md): the relaunch only chooses
among them, and creates nothing.
Only the standard library and contract/: part of the run controller's Lambda asset.
"""

import datetime
import json

from controller.snapshot import Zone

# Every zone is tried this many times, waiting longer after each round, before the run gives up.
CAPACITY_ROUNDS = 4
CAPACITY_WAIT = datetime.timedelta(minutes=10)  # after the first round; doubled after each
MAX_CAPACITY_WAIT = datetime.timedelta(hours=1)


def parse_zones(text: str) -> list[Zone]:
    """The output's zones in try order, the deployed one first, each zone once (the output may
    repeat one to fill its length): [{"zone", "subnet", "group"}]. [] when there is no usable
    output: the fleet stays in its zone, launched as its templates say."""
    try:
        entries = json.loads(text)["zones"]
        zones = [{k: str(e[k]) for k in ("zone", "subnet", "group")} for e in entries]
    except (ValueError, KeyError, TypeError):
        return []
    seen: set[str] = set()
    return [z for z in zones if not (z["zone"] in seen or seen.add(z["zone"]))]


def try_order(zones: list[Zone], current: str | None) -> list[Zone]:
    """The zones a relaunch tries in turn, the fleet's current zone first; for a fleet without
    zones, its current zone alone, launched without overrides."""
    if not zones:
        return [{"zone": current, "subnet": None, "group": None}]
    names = [z["zone"] for z in zones]
    start = names.index(current) if current in names else 0
    return zones[start:] + zones[:start]


def zone_of_try(order: list[Zone], number: int) -> Zone:
    """The zone try `number` (from 1) launches in."""
    return order[(number - 1) % len(order)]


def wait_after(number: int, zones: int, base: datetime.timedelta = CAPACITY_WAIT):
    """How long to wait after try `number` found no capacity: nothing while the round has zones
    left, then twice as long after each round (up to an hour); None after the last round."""
    zones = max(zones, 1)
    if number % zones:
        return datetime.timedelta(0)
    rounds = number // zones
    if rounds >= CAPACITY_ROUNDS:
        return None
    return min(base * 2 ** (rounds - 1), MAX_CAPACITY_WAIT)
