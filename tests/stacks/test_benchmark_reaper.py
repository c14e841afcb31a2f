"""The reaper tears a benchmark fleet down once its logs are in S3: a benchmark has no checkpoint."""

import json

import boto3
import pytest
from test_reaper import (  # noqa: F401  (aws and reaper are fixtures)
    BUCKET,
    REGION,
    RUN,
    aws,
    decisions,
    reaper,
    s3_event,
    stack_status,
)


@pytest.mark.parametrize(("benchmark", "deleted"), [("synthetic", True), (None, False)])
def test_a_benchmark_needs_only_its_logs(reaper, capsys, benchmark, deleted):  # noqa: F811
    s3 = boto3.client("s3", region_name=REGION)
    s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/logs/node-0/bootstrap.log", Body=b"table")
    done = {"run": RUN, "status": "succeeded", "benchmark": benchmark}
    s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/DONE.json", Body=json.dumps(done).encode())
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    assert (stack_status("TrainStack") in (None, "DELETE_COMPLETE")) is deleted
    expected = ["delete-stack", "follow-delete"] if deleted else ["wait-for-results"]
    recorded = decisions(capsys)
    assert [d["decision"] for d in recorded] == ["attempt-ended", *expected]
    assert recorded[0]["attempt"]["decision"] == "teardown"  # a benchmark is never relaunched
