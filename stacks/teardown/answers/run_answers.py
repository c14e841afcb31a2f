"""The deploy-time answers of issue 50, beside answers.py (which lists them all and imports this):

    Custom::HorovodFleetImage      the baked image ImageStack holds, or a one-line refusal while
                                   it bakes, before any is baked, or when it is another checkout's
    Custom::HorovodFleetRunCheck   a redeploy of a run with other training values is refused,
                                   naming them, unless -c allowChange=true
    Custom::HorovodFleetRunRecord  runs/<run>/config.json: every context value of the deploy

Each is asked by CloudFormation through CDK's Provider framework, whose exception message is the
failed deploy's reason (answers.py). A FAILED answer fails the resource and the stack operation
("The provider must respond ... with either a SUCCESS or FAILED result", custom resource request
types, https://docs.aws.amazon.com/en_us/AWSCloudFormation/latest/UserGuide/crpg-ref-requesttypes.html);
TrainStack's instances depend on the image and the check, so a refusal comes before any launches.
A failed Create is followed by a Delete, which the framework ignores
(https://github.com/aws/aws-cdk/pull/5525), and a failed Update by an Update back with the old
properties, which must pass (answers.rolling_back). Only boto3 and the standard library: part of
the answers' Lambda asset. Each answer takes `base`, the answers module, for its clients, clock,
log and refusal: answers.py imports this module, so this one never imports it back.
"""

import json
from collections.abc import Mapping
from types import ModuleType

from botocore.exceptions import ClientError

IMAGE_TYPE = "Custom::HorovodFleetImage"
RUN_CHECK_TYPE = "Custom::HorovodFleetRunCheck"
RUN_RECORD_TYPE = "Custom::HorovodFleetRunRecord"
IMAGE_STACK = "ImageStack"
AMI_OUTPUT_KEY, IMAGE_VERSION_OUTPUT_KEY = "AmiId", "ImageVersion"  # stacks/image/stack.py
# A stack whose last operation completed, and its image with it (CloudFormation's stack statuses,
# https://docs.aws.amazon.com/sdk-for-python/v4/reference/clients/cloudformation/enums/StackStatus/).
SETTLED = ("CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE", "IMPORT_COMPLETE")
CONFIG_FORMAT = "horovod-fleet/config/1"


# --- Custom::HorovodFleetImage -------------------------------------------------------------


def image_check_command(region: str) -> str:
    """How a user sees what the image check sees (README, step 2)."""
    return (
        f"aws cloudformation describe-stacks --region {region} --stack-name {IMAGE_STACK} "
        "--query 'Stacks[0].[StackStatus,Outputs]'"
    )


def answer_image(event: Mapping, base: ModuleType) -> dict:
    """The AMI ImageStack baked (its AmiId output) when ImageStack has settled and holds the
    image this checkout bakes (`Version`, its ImageVersion output); else the deploy fails in one
    line naming what to wait for and how to check it. The physical id is the AMI, so a rollback's
    Update answers the image the stack had."""
    props = event.get("ResourceProperties", {})
    want, region = props.get("Version", ""), props.get("Region", "")
    physical_id = event.get("PhysicalResourceId") or ""
    if event["RequestType"] == "Update" and base.rolling_back(event["StackId"]):
        return {"PhysicalResourceId": physical_id, "Data": {"ImageId": physical_id}}
    check = image_check_command(region)
    bake = f"npx cdk deploy {IMAGE_STACK} --output cdk.out.image"
    try:
        [stack] = base.client("cloudformation").describe_stacks(StackName=IMAGE_STACK)["Stacks"]
    except ClientError as error:
        if "does not exist" not in str(error):
            raise base.Refused(f"cannot read {IMAGE_STACK}: {error}"[:1000]) from error
        raise base.Refused(
            f"no training image is baked yet ({IMAGE_STACK} is not deployed): run {bake} and "
            "wait for it to return (about 3 hours the first time), then deploy TrainStack; "
            f"check with {check}; or -c ami= an image of your own"
        ) from error
    status = stack["StackStatus"]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    if status.endswith("_IN_PROGRESS"):
        raise base.Refused(
            f"{IMAGE_STACK} is {status}: the training image is still baking (about 3 hours the "
            f"first time). Wait for {bake} to return, check with {check} until it says "
            "CREATE_COMPLETE or UPDATE_COMPLETE, then deploy TrainStack again"
        )
    have, ami = outputs.get(IMAGE_VERSION_OUTPUT_KEY), outputs.get(AMI_OUTPUT_KEY)
    if status not in SETTLED or not ami:
        raise base.Refused(
            f"{IMAGE_STACK} is {status} with no baked image: its bake failed (its BakeLogs "
            f"output names the logs). Fix it, run {bake} again and wait for it, then deploy "
            f"TrainStack; check with {check}"
        )
    if have != want:
        raise base.Refused(
            f"{IMAGE_STACK} holds {have or 'an image from before image versions'}, and this "
            f"checkout bakes {want}: run {bake} and wait for it to return (it bakes again only "
            "when bootstrap/image/, bootstrap/image_proof/ or trainer/ changed: then about 3 "
            f"hours), then deploy TrainStack; check with {check}"
        )
    base.log(IMAGE_TYPE, image=ami, version=have, stack_status=status)
    return {"PhysicalResourceId": ami, "Data": {"ImageId": ami}}


# --- Custom::HorovodFleetRunCheck and Custom::HorovodFleetRunRecord --------------------------


def config_key(run: str) -> str:
    return f"runs/{run}/config.json"


def read_record(bucket: str, run: str, base: ModuleType) -> dict | None:
    """runs/<run>/config.json, None when there is none; a read S3 refuses fails in one line."""
    try:
        body = base.client("s3").get_object(Bucket=bucket, Key=config_key(run))["Body"].read()
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise base.Refused(
            f"cannot read s3://{bucket}/{config_key(run)}: {error}"[:1000]
        ) from error
    return json.loads(body)


def values_text(values: Mapping, keys: list[str]) -> str:
    return ", ".join(f"{key}={values.get(key)}" for key in keys)


def answer_run_check(event: Mapping, base: ModuleType) -> dict:
    """Refuses, in one line naming them, training values (`Training`) that differ from the run's
    record, unless `AllowChange` is "true". No record: the run's first deploy. A rollback's
    Update passes: it only brings back what was deployed."""
    props = event.get("ResourceProperties", {})
    bucket, run = props.get("Bucket", ""), props.get("Run", "")
    wanted = json.loads(props.get("Training") or "{}")
    answer = {"PhysicalResourceId": f"s3://{bucket}/{config_key(run)}", "Data": {"Changed": ""}}
    if event["RequestType"] == "Update" and base.rolling_back(event["StackId"]):
        return answer
    record = read_record(bucket, run, base)
    deployed = (record or {}).get("training") or {}
    changed = [key for key in wanted if key in deployed and deployed[key] != wanted[key]]
    if changed and props.get("AllowChange") != "true":
        raise base.Refused(
            f"run {run} was deployed with {values_text(deployed, changed)} and this deploy asks "
            f"for {values_text(wanted, changed)}: its checkpoints in s3://{bucket}/runs/{run}/ "
            "would resume under other values. Deploy it as another run (-c run=NAME), or add "
            "-c allowChange=true to go on with these"
        )
    answer["Data"]["Changed"] = ",".join(changed)
    return answer


def answer_run_record(event: Mapping, base: ModuleType) -> dict:
    """Writes runs/<run>/config.json: every context value of the deploy (`Context`), its
    training values (`Training`), the stack, when; and each earlier deploy's training values
    that differ (`changes`, oldest first). The same deploy asked again writes nothing new. A
    read or write S3 refuses is logged, not raised: the fleet is up (this answer comes last),
    and a record is not worth ending it for."""
    props = event.get("ResourceProperties", {})
    bucket, run = props.get("Bucket", ""), props.get("Run", "")
    context, training = (json.loads(props.get(k) or "{}") for k in ("Context", "Training"))
    url = f"s3://{bucket}/{config_key(run)}"
    answer = {"PhysicalResourceId": url}
    try:
        record = read_record(bucket, run, base) or {}
    except base.Refused as refused:
        base.log(RUN_RECORD_TYPE, url=url, error=str(refused))
        record = {}
    if record.get("context") == context and record.get("stack_id") == event["StackId"]:
        return answer
    changes = list(record.get("changes") or [])
    if record.get("training") and record["training"] != training:
        changes.append({"deployed_at": record.get("deployed_at"), "training": record["training"]})
    document = {
        "format": CONFIG_FORMAT,
        "run": run,
        "stack_id": event["StackId"],
        "deployed_at": base.now().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "training": training,
        "context": context,
        "changes": changes,
    }
    try:
        base.client("s3").put_object(
            Bucket=bucket,
            Key=config_key(run),
            Body=json.dumps(document, indent=1, sort_keys=True).encode(),
            ContentType="application/json",
        )
    except ClientError as error:
        base.log(RUN_RECORD_TYPE, url=url, error=str(error))
    return answer
