"""capacityReservationId: the fleet launches into an On-Demand Capacity Reservation or a
Capacity Block for ML, and a bad value is one line naming what is allowed."""

import pytest
from conftest import fleet_launch_template

from stacks.config import CapacityReservation, ConfigError, FleetConfig

RESERVATION = "cr-0123456789abcdef0"


def launch_template_data(templates) -> dict:
    _, template = fleet_launch_template(templates["TrainStack"])
    return template["Properties"]["LaunchTemplateData"]


def context(**overrides):
    import app

    return {**app.default_context(), **overrides}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        (RESERVATION, CapacityReservation(id=RESERVATION, block=False)),
        (f"block:{RESERVATION}", CapacityReservation(id=RESERVATION, block=True)),
    ],
)
def test_reservation_values(value, expected):
    config = FleetConfig.from_context(context(capacityReservationId=value, az="us-east-1a"))
    assert config.capacity_reservation == expected


@pytest.mark.parametrize(
    "value", ["cr-123", "block:", "odcr-0123456789abcdef0", 7, "CR-0123456789ABCDEF0"]
)
def test_a_bad_reservation_is_one_line(value):
    with pytest.raises(ConfigError) as error:
        FleetConfig.from_context(context(capacityReservationId=value))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("error: context key capacityReservationId=")
    assert "block:cr-" in message


def test_no_reservation_by_default(default):
    data = launch_template_data(default)
    assert "CapacityReservationSpecification" not in data
    assert "InstanceMarketOptions" not in data


def test_launch_template_requires_imdsv2(default):
    assert launch_template_data(default)["MetadataOptions"] == {
        "HttpEndpoint": "enabled",
        "HttpTokens": "required",
    }


def test_on_demand_reservation_is_targeted(synth):
    # test_train_stack.py's configuration of a reservation: one synthesis for both files.
    data = launch_template_data(synth(capacityReservationId=RESERVATION, az="use1-az4", nodes=2))
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": RESERVATION}
    }
    assert "InstanceMarketOptions" not in data


def test_capacity_block_needs_its_market_type(synth):
    data = launch_template_data(
        synth(capacityReservationId=f"block:{RESERVATION}", az="us-east-1a")
    )
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": RESERVATION}
    }
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}


def test_synth_names_the_reservation_check():
    import app

    config = FleetConfig.from_context(
        context(capacityReservationId=f"block:{RESERVATION}", az="us-east-1a")
    )
    note = app.capacity_note(config)
    assert f"Capacity Block for ML {RESERVATION}" in note
    assert (
        f"describe-capacity-reservations --region us-east-1 --capacity-reservation-ids {RESERVATION}"
        in note
    )
