"""Where a run's facts are: the bucket, TrainStack's outputs, the log group. Every AWS call here
fails within seconds: short timeouts, one attempt (options from
https://docs.aws.amazon.com/boto3/latest/guide/retries.html and botocore's Config)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
)

from contract import names, runs

DEFAULT_REGION = "us-east-1"  # cdk.json's default region
QUICK = Config(
    connect_timeout=3, read_timeout=10, retries={"total_max_attempts": 1, "mode": "standard"}
)


class WatchError(Exception):
    """One line for the user: what is missing, and how to give it."""


def region_of(explicit: str | None) -> str:
    return (
        explicit
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or DEFAULT_REGION
    )


def explain(exc: Exception) -> WatchError:
    """An AWS failure as the one line that names what is missing."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or "AWS"
    if isinstance(exc, NoCredentialsError):
        return WatchError(
            "no AWS credentials: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "or run `aws configure`"
        )
    if isinstance(exc, NoRegionError):
        return WatchError("no AWS region: pass --region or set AWS_REGION")
    if isinstance(exc, EndpointConnectionError):
        return WatchError(f"cannot reach {endpoint}: {message_line(exc)}")
    if isinstance(exc, BotoCoreError):  # timeouts, an endpoint that is not an AWS API
        return WatchError(f"no answer from {endpoint}: {type(exc).__name__}: {message_line(exc)}")
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return WatchError(
            f"{endpoint} refused {exc.operation_name}: {error.get('Code')}: {error.get('Message')}"
        )
    return WatchError(f"{endpoint}: {type(exc).__name__}: {message_line(exc)}")


def message_line(exc: Exception) -> str:
    """The error's message without its type, on one line, cut at 300 characters."""
    return " ".join(str(exc).split())[:300]


@dataclass
class Fleet:
    """The AWS clients for one region and what TrainStack says about the deployed run."""

    region: str
    session: boto3.Session = field(repr=False)
    outputs: dict = field(default_factory=dict)
    stack_status: str | None = None
    stack_created: datetime | None = None
    stack_id: str | None = None
    tags: dict = field(default_factory=dict)  # TrainStack's stack-level tags
    clients: dict = field(default_factory=dict, repr=False)  # one client per service, made once

    @classmethod
    def connect(cls, region: str | None) -> Fleet:
        return cls(region_of(region), boto3.Session(region_name=region_of(region)))

    def client(self, service: str):
        if service not in self.clients:
            self.clients[service] = self.session.client(service, config=QUICK)
        return self.clients[service]

    def read_train_stack(self) -> None:
        """TrainStack's status, creation time and outputs, when it exists."""
        try:
            stacks = self.client("cloudformation").describe_stacks(StackName=names.TRAIN_STACK)
        except ClientError as exc:
            if "does not exist" in str(exc):
                return
            raise
        stack = stacks["Stacks"][0]
        self.stack_status = stack["StackStatus"]
        self.stack_created = stack.get("CreationTime")
        self.stack_id = stack.get("StackId")
        self.outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
        self.tags = {t["Key"]: t["Value"] for t in stack.get("Tags", [])}

    def image_stack_status(self) -> str | None:
        try:
            stacks = self.client("cloudformation").describe_stacks(StackName="ImageStack")
        except ClientError:
            return None
        return stacks["Stacks"][0]["StackStatus"]

    def bucket(self, explicit: str | None) -> str:
        """--bucket, else TrainStack's Results output, else DatasetStack's naming."""
        if explicit:
            return explicit
        results = self.outputs.get("Results", "")
        if results.startswith("s3://"):
            return results[len("s3://") :].split("/", 1)[0]
        account = self.client("sts").get_caller_identity()["Account"]
        return f"horovod-fleet-{account}-{self.region}"


class RunStore:
    """runs/ in the bucket."""

    def __init__(self, s3, bucket: str) -> None:
        self.s3, self.bucket = s3, bucket

    def read_json(self, key: str) -> dict | None:
        return self.read_with_etag(key)[0]

    def read_with_etag(self, key: str) -> tuple[dict | None, str | None]:
        """The JSON document at `key` and its ETag; (None, None) when there is none."""
        try:
            got = self.s3.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None, None
            if exc.response.get("Error", {}).get("Code") == "NoSuchBucket":
                raise WatchError(
                    f"bucket {self.bucket} does not exist: pass --bucket, or --region where "
                    "DatasetStack is"
                ) from None
            raise
        return json.loads(got["Body"].read()), got["ETag"]

    def put_json(self, key: str, document: dict, etag: str | None) -> bool:
        """Write `document` only where the record is as read (its `etag`; None: where there is
        none, https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html);
        False when it changed since."""
        condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        try:
            self.s3.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=json.dumps(document, indent=1).encode(),
                ContentType="application/json",
                **condition,
            )
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                return False
            raise
        return True

    def runs(self) -> list[str]:
        found, token = [], None
        while True:
            kwargs = {"Bucket": self.bucket, "Prefix": runs.RUNS, "Delimiter": "/"}
            if token:
                kwargs["ContinuationToken"] = token
            try:
                page = self.s3.list_objects_v2(**kwargs)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "NoSuchBucket":
                    raise WatchError(
                        f"bucket {self.bucket} does not exist: pass --bucket, or --region "
                        "where DatasetStack is"
                    ) from None
                raise
            found += [p["Prefix"][len(runs.RUNS) : -1] for p in page.get("CommonPrefixes", [])]
            token = page.get("NextContinuationToken")
            if not token:
                return found

    def head(self, run: str) -> dict | None:
        """The head's heartbeat (runs/<run>/head.json): its instance and address."""
        return self.read_json(runs.key(run, runs.HEAD))

    def nodes(self, run: str) -> dict[int, dict]:
        listing = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=runs.key(run, runs.NODES))
        found = {}
        for obj in listing.get("Contents", []):
            entry = self.read_json(obj["Key"])
            if entry:
                found[entry["index"]] = entry
        return found
