"""How each context value is read (stacks/config.py FleetConfig.from_context): one parser per
kind of value, each saying in one line what is allowed when it refuses (ConfigError)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stacks import benchmark
from stacks.instance_types import (
    BURSTABLE_TYPES,
    GPU_TYPES,
    JIT_PROOF_TYPES,
    RETIRED_FAMILIES,
    UNDRIVABLE_FAMILIES,
    BurstableType,
    GpuType,
    JitProofType,
)

_INSTANCE_TYPE = re.compile(r"([a-z]+)(\d+)([a-z0-9-]*)\.([a-z0-9]+)")
_CAPACITY_RESERVATION = re.compile(r"(block:)?cr-[0-9a-f]{17}")


class ConfigError(ValueError):
    """A bad context value; str() is one line naming the key, the value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"error: context key {key}={value!r} is invalid; allowed: {allowed}")


Parser = Callable[[Any], Any]


class Getter:
    """Applies a parser to one context value and turns its complaint into a ConfigError."""

    def __init__(self, context: Mapping[str, Any]) -> None:
        self._context = context

    def __call__(self, key: str, parse: Parser) -> Any:
        value = self._context.get(key)
        try:
            return parse(value)
        except Invalid as invalid:
            raise ConfigError(key, value, str(invalid)) from None


class Invalid(ValueError):
    """Raised by a parser with the text that says what is allowed."""


def integer(low: int, high: int) -> Parser:
    allowed = f"an integer from {low} to {high}"

    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise Invalid(allowed)
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
            value = int(value)
        if not isinstance(value, int) or not low <= value <= high:
            raise Invalid(allowed)
        return value

    return parse


def number(low: float, high: float) -> Parser:
    allowed = f"a number of hours from {low:g} to {high:g}"

    def parse(value: Any) -> float:
        if isinstance(value, bool):
            raise Invalid(allowed)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise Invalid(allowed) from None
        if not math.isfinite(number) or not low <= number <= high:
            raise Invalid(allowed)
        return number

    return parse


def top1(value: Any) -> float:
    allowed = "empty (train every epoch) or a top-1 accuracy in (0, 1], like 0.759"
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        raise Invalid(allowed) from None
    if not 0 < number <= 1:  # nan fails too
        raise Invalid(allowed)
    return number


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise Invalid("true or false")


def benchmark_mode(value: Any) -> str | None:
    if isinstance(value, bool):
        value = str(value).lower()
    if isinstance(value, str) and value.strip().lower() in benchmark.MODES:
        return benchmark.MODES[value.strip().lower()]
    raise Invalid(
        "false, true (or synthetic: generated images through the host-to-device copy) "
        "or data (the local TFRecords)"
    )


def matching(pattern: re.Pattern[str], allowed: str) -> Parser:
    def parse(value: Any) -> str:
        if not isinstance(value, str) or not pattern.fullmatch(value) or ".." in value:
            raise Invalid(allowed)
        return value

    return parse


def optional(parse: Parser) -> Parser:
    def parse_optional(value: Any) -> Any:
        return None if value is None or value == "" else parse(value)

    return parse_optional


def one_of(choices: tuple[str, ...]) -> Parser:
    def parse(value: Any) -> str:
        if value not in choices:
            raise Invalid(" or ".join(choices))
        return value

    return parse


# The zones of the regions that sell p4d and p5, by their letters: as many as the region has AZ
# IDs (use1-az1 to use1-az6 in us-east-1), from AWS's list of Availability Zones,
# https://docs.aws.amazon.com/global-infrastructure/latest/regions/aws-availability-zones.html.
# Other regions are checked by shape only; CloudFormation names a zone they lack at deploy.
ZONE_LETTERS: dict[str, str] = {"us-east-1": "abcdef", "us-east-2": "abc", "us-west-2": "abcd"}
# ... and the prefix of their zone IDs (AZ IDs): the region code shortened to its letters and
# number, then -az and a number (same page: euw1-az1 to euw1-az3 in eu-west-1), numbered from 1
# to as many as the region has zones (use1-az1 to use1-az6). A zone ID is the same physical
# zone in every account, while a zone name may be a different zone in each account,
# https://docs.aws.amazon.com/global-infrastructure/latest/regions/az-ids.html. The zone check
# turns an ID into this account's zone name at deploy (DescribeAvailabilityZones).
ZONE_ID_PREFIXES: dict[str, str] = {"us-east-1": "use1", "us-east-2": "use2", "us-west-2": "usw2"}
_ZONE_ID = re.compile(r"([a-z]+\d+)-az(\d+)")


def is_zone_id(az: str) -> bool:
    """`use1-az4` (a zone ID), not `us-east-1d` (a zone name)."""
    return _ZONE_ID.fullmatch(az) is not None


@dataclass(frozen=True)
class Placement:
    """Where the stacks' instances go: a zone, and the user's own VPC and subnet in it (both or
    neither; None: each stack makes its own)."""

    # A zone name or a zone ID (use1-az4). When not chosen (-c az empty), the region's first zone
    # by name, which synthesis names where it needs one, while the deploy-time zone answers take
    # the region's first zone that offers the type (stacks/train/stack.py,
    # stacks/preprocess/stack.py).
    az: str
    az_chosen: bool = True
    vpc_id: str | None = None
    subnet_id: str | None = None

    @property
    def preferred_zone(self) -> str:
        """The zone the deploy-time answers prefer; "" for none."""
        return self.az if self.az_chosen else ""


def zone_of(region: str) -> Parser:
    letters = ZONE_LETTERS.get(region)
    prefix = ZONE_ID_PREFIXES.get(region)
    if letters and prefix:
        allowed = (
            f"a zone of region {region} ({region}{letters[0]} to {region}{letters[-1]}) "
            f"or its zone ID ({prefix}-az1 to {prefix}-az{len(letters)})"
        )
    else:  # by shape: the region's name and a letter, or a zone ID like the region's
        allowed = (
            f"a zone of region {region}, like {region}a, or its zone ID "
            "(<region prefix>-az<number>, as use1-az4 is in us-east-1)"
        )

    def parse(value: Any) -> str:
        if not isinstance(value, str):
            raise Invalid(allowed)
        name = re.fullmatch(re.escape(region) + r"[a-z]", value)
        if name and (letters is None or value[-1] in letters):
            return value
        zone_id = _ZONE_ID.fullmatch(value)
        if zone_id and prefix is not None:
            if zone_id.group(1) == prefix and 1 <= int(zone_id.group(2)) <= len(letters or ""):
                return value
        elif zone_id:  # a region outside the tables: the prefix starts and ends as it does
            zone_prefix, number = zone_id.group(1), int(zone_id.group(2))
            ends = region.rsplit("-", 1)[-1]
            if zone_prefix.startswith(region[:2]) and zone_prefix.endswith(ends) and number >= 1:
                return value
        raise Invalid(allowed)

    return parse


def gpu_type(successor: str) -> Parser:
    """A type of GPU_TYPES; a retired or undrivable one is named as such, with what to use."""

    def parse(value: Any) -> GpuType:
        if isinstance(value, str) and value in GPU_TYPES:
            return GPU_TYPES[value]
        shape = _INSTANCE_TYPE.fullmatch(value) if isinstance(value, str) else None
        family = shape and shape.group(1) + shape.group(2)
        if family in RETIRED_FAMILIES:
            raise Invalid(f"a type AWS still sells: {RETIRED_FAMILIES[family]}; use {successor}")
        if family in UNDRIVABLE_FAMILIES:
            raise Invalid(f"a type this image can drive: {UNDRIVABLE_FAMILIES[family]}")
        known = ", ".join(GPU_TYPES)
        if shape and shape.group(1) not in ("p", "g"):
            raise Invalid(f"a GPU instance type ({value} has no GPU): {known}")
        raise Invalid(f"a known GPU instance type: {known}")

    return parse


def jit_proof_type(value: Any) -> JitProofType:
    if isinstance(value, str) and value in JIT_PROOF_TYPES:
        return JIT_PROOF_TYPES[value]
    raise Invalid(
        "empty (no JIT proof) or a type whose GPUs TensorFlow 2.15.1 JIT-compiles for "
        f"(H100, H200: compute capability 9.0): {', '.join(JIT_PROOF_TYPES)}"
    )


def burstable_type(value: Any) -> BurstableType:
    if isinstance(value, str) and value in BURSTABLE_TYPES:
        return BURSTABLE_TYPES[value]
    raise Invalid(f"a t2/t3 instance type: {', '.join(BURSTABLE_TYPES)}")


@dataclass(frozen=True)
class CapacityReservation:
    """Where the fleet launches: an On-Demand Capacity Reservation or a Capacity Block for ML."""

    id: str
    block: bool


def capacity_reservation(value: Any) -> CapacityReservation:
    if not isinstance(value, str) or not _CAPACITY_RESERVATION.fullmatch(value):
        raise Invalid(
            "empty, an On-Demand Capacity Reservation id like cr-0123456789abcdef0, or "
            "block:cr-0123456789abcdef0 for a Capacity Block for ML"
        )
    return CapacityReservation(id=value.removeprefix("block:"), block=value.startswith("block:"))
