"""ImageStack: the training AMI, baked by EC2 Image Builder from bootstrap/image/ and proven on a
GPU before any fleet boots from it.

Two images, because one Image Builder infrastructure configuration names the instance types of
both its build and its test instances:
1. `horovod-fleet-training-base`, built on a CPU instance (compiling needs no GPU): the eight
   recipe steps of bootstrap/image/, each an Image Builder component whose build phase runs the
   step, whose validate phase checks it on the build instance, and whose test phase checks it
   again on an instance booted from the new AMI.
2. `horovod-fleet-training`, on the base image, on one GPU instance (imageTestInstanceType): the
   GPU proof of bootstrap/image_proof/ (driver, TensorFlow, Horovod, an allreduce over every GPU,
   the aws-ofi-nccl plugin, 200 steps of the trainer's ResNet-50), recorded in image.json; its
   test phase boots the finished AMI on the same type and tags it with the proof's figures.
A failed step or check fails the image, the deploy, and every stack that depends on it.

Versions follow content: every component and recipe version is derived from the sha256 of the
files it runs, so a new image is baked when, and only when, those files change.
"""

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk import (
    Acknowledgment,
    CfnOutput,
    CrossStackReferences,
    Fn,
    IgnoreMode,
    ReferenceStrength,
    RemovalPolicy,
    Stack,
    Tags,
    Validations,
)
from aws_cdk import aws_iam as iam
from aws_cdk import aws_imagebuilder as imagebuilder
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from stacks.instance_types import GpuType
from stacks.nag import SSM_MANAGED_POLICY, acknowledge_ssm_policy, acknowledge_wildcard_resources
from stacks.network import SingleZoneNetwork, web_egress_security_group
from stacks.node_code import CODE_EXCLUDE, CODE_ROOT, PROJECT

RECIPE_DIR = CODE_ROOT / "bootstrap" / "image"
PROOF_DIR = CODE_ROOT / "bootstrap" / "image_proof"
TRAINER_DIR = CODE_ROOT / "trainer"
# Canonical's Ubuntu 22.04 on the AWS kernel, resolved by Image Builder when it builds (a recipe
# parent may be "ssm:" + a parameter), so a new Canonical release never changes the template.
# 22.04 has gp2 parameters only. https://documentation.ubuntu.com/aws/en/latest/aws-how-to/instances/find-ubuntu-images/
# https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-imagebuilder-imagerecipe.html
UBUNTU_PARENT = (
    "ssm:/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id"
)
# Where the recipe, the proof and the trainer they run live inside the image (the image keeps
# the recipe that made it); /opt/horovod-fleet/{bootstrap,trainer} stay the nodes' own code.
SOURCE_DIR = "/opt/horovod-fleet/src"
IMAGE_PARAMETER = "/horovod-fleet/training-ami"
BASE_NAME = f"{PROJECT}-training-base"
PROVEN_NAME = f"{PROJECT}-training"
ROOT_GIB = 60  # CUDA, the NCCL build, ~10 GB of TensorFlow and CUDA wheels; nodes' roots are bigger
KEEP_IMAGES = 2


@dataclass(frozen=True)
class RecipeStep:
    """One script of bootstrap/image/, one Image Builder component."""

    script: str
    description: str
    timeout_s: int
    reboot_after: bool = False


# The recipe, in order (bootstrap/image/*.sh). AWSTOE stops a step after 2 h unless told.
RECIPE: tuple[RecipeStep, ...] = (
    RecipeStep("01-system", "full upgrade, AWS kernel, no unattended upgrades", 3600, True),
    RecipeStep("02-nvidia-driver", "NVIDIA R580 closed modules for the AWS kernel, held", 3600),
    RecipeStep("03-efa", "EFA installer (signature verified), Open MPI 4, aws-ofi-nccl", 3600),
    RecipeStep("04-cuda-toolkit", "CUDA 12.2 compiler and headers, no driver", 3600),
    RecipeStep("05-nccl", "NCCL built for sm_70/75/80/90", 7200),
    RecipeStep("06-python-env", "TensorFlow 2.15.1 venv, Horovod 0.28.1 with NCCL/MPI/Gloo", 7200),
    RecipeStep("07-agents", "CloudWatch agent (signature verified), SSM agent, AWS CLI", 1800),
    RecipeStep("08-manifest", "image.json: every version, Horovod's build, the recipe hash", 600),
)
PROOF_TIMEOUT_S = 5400

# Bake cost estimate: list prices (us-east-1, Linux, on-demand; check them on
# https://aws.amazon.com/ec2/pricing/on-demand/) and hours per stage estimated from the steps,
# not measured: nothing of this project has run on AWS yet.
BUILD_INSTANCE_TYPE = "c6i.4xlarge"
BUILD_USD_PER_HOUR = 0.68
BASE_BUILD_HOURS = 1.25  # 16 vCPUs: upgrade + reboot, driver, EFA, CUDA, NCCL x4 archs, Horovod
BASE_TEST_HOURS = 0.25  # an instance booted from the base AMI re-checks every step
PROOF_BUILD_HOURS = 0.6  # boot, TensorFlow and NCCL checks, XLA compile, 200 ResNet-50 steps
PROOF_TEST_HOURS = 0.25  # boot the finished AMI, nvidia-smi, tag it
SNAPSHOT_HOURS = 0.25  # per image, while no instance runs


def tree_sha256(directory: Path) -> str:
    """sha256 over the sorted `sha256sum ./path` lines of every file under directory, which is
    what bootstrap/image/step.sh's recipe_sha256 computes on the build instance."""
    files = sorted(
        path.relative_to(directory).as_posix()
        for path in directory.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    )
    lines = "".join(
        f"{hashlib.sha256((directory / name).read_bytes()).hexdigest()}  ./{name}\n"
        for name in files
    )
    return hashlib.sha256(lines.encode()).hexdigest()


def semantic_version(digest: str) -> str:
    """An Image Builder version from a content hash: each node may be up to 2^30 - 1."""
    return f"1.0.{int(digest[:7], 16)}"


def read_pins() -> dict[str, str]:
    """pins.env, the one list of the image's versions (the recipe's scripts source it)."""
    pins = {}
    for line in (RECIPE_DIR / "pins.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pins[key] = value.strip('"')
    return pins


def bake_estimate(test_type: GpuType) -> str:
    """The line synthesis prints: what a bake costs and how long it takes."""
    build_usd = (BASE_BUILD_HOURS + BASE_TEST_HOURS) * BUILD_USD_PER_HOUR
    gpu_usd = (PROOF_BUILD_HOURS + PROOF_TEST_HOURS) * test_type.usd_per_hour
    hours = (
        BASE_BUILD_HOURS + BASE_TEST_HOURS + PROOF_BUILD_HOURS + PROOF_TEST_HOURS
    ) + 2 * SNAPSHOT_HOURS
    return (
        f"ImageStack: bakes only when bootstrap/image, bootstrap/image_proof or trainer/ change: "
        f"about {hours:.1f} h, ~${build_usd + gpu_usd:.2f} "
        f"({BASE_BUILD_HOURS + BASE_TEST_HOURS:g} h {BUILD_INSTANCE_TYPE} at "
        f"${BUILD_USD_PER_HOUR:g}/h + {PROOF_BUILD_HOURS + PROOF_TEST_HOURS:g} h "
        f"{test_type.name} at ${test_type.usd_per_hour:g}/h for the GPU proof; estimates)"
    )


# ------------------------------------------------------------------ component documents (AWSTOE)


def _scalar(value: Any) -> str:
    """A YAML scalar: JSON's double-quoted strings and numbers are valid YAML."""
    return json.dumps(value)


def _yaml(node: Any, indent: int = 0) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            if isinstance(value, Mapping | list) and value:
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml(value, indent + 2))
            else:
                lines.append(f"{pad}{key}: {_scalar(value)}")
    else:
        for item in node:
            if isinstance(item, Mapping):
                first, *rest = _yaml(item, indent + 2)
                lines.append(f"{pad}- {first.lstrip()}")
                lines.extend(rest)
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    return lines


def component_document(
    *,
    name: str,
    description: str,
    fetch: Sequence[tuple[s3_assets.Asset, str]],
    build: str,
    check: str,
    test: str,
    timeout_s: int,
    reboot_after: bool = False,
) -> str:
    """An AWSTOE document: the build phase fetches the code (asset zip -> directory under
    SOURCE_DIR) and runs the step; validate runs the check on the build instance; test runs
    `test` on an instance booted from the finished AMI, where the code is part of the image."""
    downloads = [
        {"source": asset.s3_object_url, "destination": f"/tmp/{Path(target).name}.zip"}
        for asset, target in fetch
    ]
    unpack = [
        f"rm -rf {SOURCE_DIR}/{target} && mkdir -p {SOURCE_DIR}/{target} && "
        f"python3 -m zipfile -e /tmp/{Path(target).name}.zip {SOURCE_DIR}/{target}"
        for _, target in fetch
    ]
    build_steps: list[dict[str, Any]] = [
        {"name": "Fetch", "action": "S3Download", "inputs": downloads},
        {
            "name": "Unpack",
            "action": "ExecuteBash",
            "inputs": {
                "commands": [
                    f"mkdir -p {SOURCE_DIR}/bootstrap",
                    f"touch {SOURCE_DIR}/bootstrap/__init__.py",
                    *unpack,
                ]
            },
        },
        {
            "name": "Run",
            "action": "ExecuteBash",
            "timeoutSeconds": timeout_s,
            "inputs": {"commands": [build]},
        },
    ]
    if reboot_after:
        build_steps.append({"name": "Reboot", "action": "Reboot", "inputs": {"delaySeconds": 0}})

    def phase(phase_name: str, command: str) -> dict[str, Any]:
        step = {"name": "Check", "action": "ExecuteBash", "timeoutSeconds": 1800}
        return {"name": phase_name, "steps": [{**step, "inputs": {"commands": [command]}}]}

    document = {
        "name": name,
        "description": description,
        "schemaVersion": 1.0,
        "phases": [
            {"name": "build", "steps": build_steps},
            phase("validate", check),
            phase("test", test),
        ],
    }
    return "\n".join(_yaml(document)) + "\n"


# ------------------------------------------------------------------ constructs


class BakeInfrastructure(Construct):
    """What the build and test instances run with: a subnet that reaches the internet (apt,
    NVIDIA, PyPI, GitHub, AWS), a group with no ingress, a role and one infrastructure
    configuration per instance type."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        az: str,
        vpc_id: str | None,
        subnet_id: str | None,
        assets: Iterable[s3_assets.Asset],
    ) -> None:
        super().__init__(scope, construct_id)
        network = SingleZoneNetwork(
            self, "Network", az=az, private=False, vpc_id=vpc_id, subnet_id=subnet_id
        )
        self.subnet = network.subnet
        self.security_group = web_egress_security_group(
            self,
            "Security",
            vpc=network.vpc,
            description="horovod-fleet image bake: no ingress; HTTPS and apt mirrors out",
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="horovod-fleet image bake: Image Builder's build and test instances",
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name("EC2InstanceProfileForImageBuilder"),
                iam.ManagedPolicy.from_aws_managed_policy_name(SSM_MANAGED_POLICY),
            ],
        )
        acknowledge_ssm_policy(self.role)
        Validations.of(self.role).acknowledge(
            Acknowledgment(
                id="AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
                "EC2InstanceProfileForImageBuilder]",
                reason="What Image Builder requires of its build instances (components, logs "
                "under /aws/imagebuilder/); AWS keeps it in step with the service.",
            )
        )
        image_arn = Stack.of(self).format_arn(
            service="ec2", account="", resource="image", resource_name="*"
        )
        self.policy = iam.Policy(
            self,
            "Policy",
            roles=[self.role],
            statements=[
                iam.PolicyStatement(
                    actions=["s3:GetObject"],
                    resources=[a.bucket.arn_for_objects(a.s3_object_key) for a in assets],
                ),
                # The GPU proof's test instance tags the AMI it booted with what it measured.
                iam.PolicyStatement(
                    actions=["ec2:CreateTags"],
                    resources=[image_arn],
                    conditions={"StringEquals": {"aws:ResourceTag/Project": PROJECT}},
                ),
            ],
        )
        acknowledge_wildcard_resources(
            self.policy,
            [image_arn],
            "The AMI's id exists only once Image Builder has made it; the condition limits the "
            "tags to this project's AMIs.",
        )
        self.profile = iam.CfnInstanceProfile(self, "Profile", roles=[self.role.role_name])

    def configuration(self, construct_id: str, name: str, instance_type: str) -> str:
        """An infrastructure configuration for one instance type; returns its ARN."""
        configuration = imagebuilder.CfnInfrastructureConfiguration(
            self,
            construct_id,
            name=name,
            description=f"horovod-fleet image bake on {instance_type}",
            instance_profile_name=self.profile.ref,
            instance_types=[instance_type],
            subnet_id=self.subnet.subnet_id,
            security_group_ids=[self.security_group.security_group_id],
            terminate_instance_on_failure=True,
            instance_metadata_options=imagebuilder.CfnInfrastructureConfiguration.InstanceMetadataOptionsProperty(
                http_tokens="required", http_put_response_hop_limit=1
            ),
            resource_tags={"Project": PROJECT},
        )
        configuration.add_resource_dependency(self.policy.node.default_child)
        configuration.node.add_dependency(self.subnet.internet_connectivity_established)
        return configuration.attr_arn


class TrainingImage(Construct):
    """The two-stage bake. `image_id` is the proven AMI; `recipe_sha256` and `proof_sha256` are
    the content hashes its versions follow."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        test_type: GpuType,
        revision: int,
        az: str,
        vpc_id: str | None,
        subnet_id: str | None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.pins = read_pins()
        self.recipe_sha256 = tree_sha256(RECIPE_DIR)
        # Bumping the revision bakes again from unchanged files: Canonical's newest base image,
        # Ubuntu's newest kernel and R580 build (the recipe holds them only inside an image).
        base_sha256 = (
            hashlib.sha256(f"{self.recipe_sha256}\n{revision}".encode()).hexdigest()
            if revision
            else self.recipe_sha256
        )
        # The proof's content: its scripts, the trainer it runs, the type it runs on, and the
        # base image it starts from (a new base means a new proof).
        self.proof_sha256 = hashlib.sha256(
            "\n".join(
                [
                    base_sha256,
                    tree_sha256(PROOF_DIR),
                    tree_sha256(TRAINER_DIR),
                    test_type.name,
                ]
            ).encode()
        ).hexdigest()
        recipe_asset = self._asset("Recipe", RECIPE_DIR, self.recipe_sha256)
        proof_asset = self._asset("Proof", PROOF_DIR, tree_sha256(PROOF_DIR))
        trainer_asset = self._asset("Trainer", TRAINER_DIR, tree_sha256(TRAINER_DIR))
        bake = BakeInfrastructure(
            self,
            "Bake",
            az=az,
            vpc_id=vpc_id,
            subnet_id=subnet_id,
            assets=[recipe_asset, proof_asset, trainer_asset],
        )
        base_version = semantic_version(base_sha256)
        self.components = [
            self._component(
                step.script,
                base_version,
                component_document(
                    name=f"{PROJECT}-{step.script}",
                    description=step.description,
                    fetch=[(recipe_asset, "bootstrap/image")],
                    build=f"bash {SOURCE_DIR}/bootstrap/image/{step.script}.sh run",
                    check=f"bash {SOURCE_DIR}/bootstrap/image/{step.script}.sh validate",
                    test=f"bash {SOURCE_DIR}/bootstrap/image/{step.script}.sh validate",
                    timeout_s=step.timeout_s,
                    reboot_after=step.reboot_after,
                ),
            )
            for step in RECIPE
        ]
        proof_script = f"{SOURCE_DIR}/bootstrap/image_proof/gpu_proof.sh"
        self.proof_component = self._component(
            "gpu-proof",
            semantic_version(self.proof_sha256),
            component_document(
                name=f"{PROJECT}-gpu-proof",
                description=f"GPU proof on {test_type.name}: driver, TensorFlow, Horovod, "
                "allreduce, aws-ofi-nccl, 200 ResNet-50 steps",
                fetch=[(proof_asset, "bootstrap/image_proof"), (trainer_asset, "trainer")],
                build=f"bash {proof_script} run {test_type.gpus} {test_type.name} "
                f"{'efa' if test_type.efa else 'no-efa'}",
                check=f"bash {proof_script} validate",
                test=f"bash {proof_script} tag",
                timeout_s=PROOF_TIMEOUT_S,
            ),
        )
        self.base = self._image(
            "Base",
            name=BASE_NAME,
            version=base_version,
            parent=UBUNTU_PARENT,
            components=self.components,
            infrastructure=bake.configuration(
                "BuildInfrastructure", BASE_NAME, BUILD_INSTANCE_TYPE
            ),
            content_sha256=base_sha256,
        )
        self.proven = self._image(
            "Proven",
            name=PROVEN_NAME,
            version=semantic_version(self.proof_sha256),
            parent=self.base.attr_image_id,
            components=[self.proof_component],
            infrastructure=bake.configuration("GpuInfrastructure", PROVEN_NAME, test_type.name),
            content_sha256=self.proof_sha256,
        )
        # Weak whatever the app's default: a fleet reads the AMI id when it deploys, so ImageStack
        # can bake a new image while a fleet runs (a strong export in use could not change).
        CrossStackReferences.of(self.proven).produce(ReferenceStrength.WEAK)
        self.image_id = self.proven.attr_image_id
        self._lifecycle()

    def _asset(self, construct_id: str, path: Path, digest: str) -> s3_assets.Asset:
        # The asset's key is the same hash the versions follow: the S3 URL inside a component
        # document changes exactly when its version does.
        return s3_assets.Asset(
            self,
            construct_id,
            path=str(path),
            exclude=CODE_EXCLUDE,
            ignore_mode=IgnoreMode.GLOB,
            asset_hash=digest,
        )

    def _component(self, step: str, version: str, document: str) -> imagebuilder.CfnComponent:
        return imagebuilder.CfnComponent(
            self,
            f"Component-{step}",
            name=f"{PROJECT}-{step}",
            platform="Linux",
            version=version,
            data=document,
            description=f"horovod-fleet training image: {step}",
        )

    def _image(
        self,
        construct_id: str,
        *,
        name: str,
        version: str,
        parent: str,
        components: Sequence[imagebuilder.CfnComponent],
        infrastructure: str,
        content_sha256: str,
    ) -> imagebuilder.CfnImage:
        log_group = logs.LogGroup(
            self,
            f"{construct_id}Logs",
            log_group_name=f"/aws/imagebuilder/{name}",
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY,
        )
        recipe = imagebuilder.CfnImageRecipe(
            self,
            f"{construct_id}Recipe",
            name=name,
            version=version,
            parent_image=parent,
            components=[
                imagebuilder.CfnImageRecipe.ComponentConfigurationProperty(
                    component_arn=component.attr_arn
                )
                for component in components
            ],
            block_device_mappings=[
                imagebuilder.CfnImageRecipe.InstanceBlockDeviceMappingProperty(
                    device_name="/dev/sda1",
                    ebs=imagebuilder.CfnImageRecipe.EbsInstanceBlockDeviceSpecificationProperty(
                        volume_size=ROOT_GIB,
                        volume_type="gp3",
                        encrypted=True,
                        delete_on_termination=True,
                    ),
                )
            ],
            working_directory="/tmp",
            # On the AMI before its test stage (distribution tags come later): the GPU proof's
            # test instance may tag only AMIs of this project.
            ami_tags=self._ami_tags(name, content_sha256),
        )
        distribution = imagebuilder.CfnDistributionConfiguration(
            self,
            f"{construct_id}Distribution",
            name=name,
            distributions=[
                imagebuilder.CfnDistributionConfiguration.DistributionProperty(
                    region=Stack.of(self).region,
                    ami_distribution_configuration={
                        "Name": f"{name}-{{{{ imagebuilder:buildDate }}}}",
                        "Description": f"horovod-fleet {name} {version}",
                        "AmiTags": self._ami_tags(name, content_sha256),
                    },
                )
            ],
        )
        image = imagebuilder.CfnImage(
            self,
            construct_id,
            image_recipe_arn=recipe.attr_arn,
            infrastructure_configuration_arn=infrastructure,
            distribution_configuration_arn=distribution.attr_arn,
            image_tests_configuration=imagebuilder.CfnImage.ImageTestsConfigurationProperty(
                image_tests_enabled=True, timeout_minutes=60
            ),
            # Package inventory through SSM adds minutes and nothing image.json lacks.
            enhanced_image_metadata_enabled=False,
        )
        # A replaced image stays for the lifecycle policy to count (it keeps the newest
        # KEEP_IMAGES and deregisters the rest with their snapshots); deleting it here would
        # only orphan its AMI, which Image Builder's DeleteImage leaves behind.
        image.apply_removal_policy(RemovalPolicy.RETAIN)
        # Image Builder would create the group itself on its first line, and the stack's own
        # group (with its retention) would then fail as already existing.
        image.node.add_dependency(log_group)
        return image

    def _ami_tags(self, name: str, content_sha256: str) -> dict[str, str]:
        pins = self.pins
        return {
            "Name": name,
            "Project": PROJECT,
            f"{PROJECT}:content-sha256": content_sha256,
            f"{PROJECT}:recipe-sha256": self.recipe_sha256,
            f"{PROJECT}:nvidia-driver": f"{pins['NVIDIA_DRIVER_BRANCH']}-server",
            f"{PROJECT}:cuda": pins["CUDA_VERSION"],
            f"{PROJECT}:nccl": pins["NCCL_VERSION"],
            f"{PROJECT}:efa-installer": pins["EFA_INSTALLER_VERSION"],
            f"{PROJECT}:tensorflow": pins["TENSORFLOW_VERSION"],
            f"{PROJECT}:horovod": pins["HOROVOD_VERSION"],
        }

    def _lifecycle(self) -> None:
        role = iam.Role(
            self,
            "LifecycleRole",
            assumed_by=iam.ServicePrincipal("imagebuilder.amazonaws.com"),
            description="horovod-fleet: deregisters training images beyond the newest two",
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name(
                    "service-role/EC2ImageBuilderLifecycleExecutionPolicy"
                )
            ],
        )
        Validations.of(role).acknowledge(
            Acknowledgment(
                id="AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                "EC2ImageBuilderLifecycleExecutionPolicy]",
                reason="The policy Image Builder's lifecycle management is documented with; its "
                "EC2 actions apply only to resources tagged CreatedBy=EC2 Image Builder.",
            )
        )
        imagebuilder.CfnLifecyclePolicy(
            self,
            "Lifecycle",
            name=f"{PROJECT}-training-images",
            description=f"keep the newest {KEEP_IMAGES} of each training image",
            execution_role=role.role_arn,
            resource_type="AMI_IMAGE",
            policy_details=[
                imagebuilder.CfnLifecyclePolicy.PolicyDetailProperty(
                    action=imagebuilder.CfnLifecyclePolicy.ActionProperty(
                        type="DELETE",
                        include_resources=imagebuilder.CfnLifecyclePolicy.IncludeResourcesProperty(
                            amis=True, snapshots=True
                        ),
                    ),
                    filter=imagebuilder.CfnLifecyclePolicy.FilterProperty(
                        type="COUNT", value=KEEP_IMAGES
                    ),
                )
            ],
            resource_selection=imagebuilder.CfnLifecyclePolicy.ResourceSelectionProperty(
                recipes=[
                    imagebuilder.CfnLifecyclePolicy.RecipeSelectionProperty(
                        name=name, semantic_version="x.x.x"
                    )
                    for name in (BASE_NAME, PROVEN_NAME)
                ]
            ),
        )


class ImageStack(Stack):
    """The training AMI, its SSM parameter, and the lifecycle that keeps the newest two."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        test_type: GpuType,
        revision: int,
        az: str,
        vpc_id: str | None,
        subnet_id: str | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        Tags.of(self).add("Project", PROJECT)
        image = TrainingImage(
            self,
            "TrainingImage",
            test_type=test_type,
            revision=revision,
            az=az,
            vpc_id=vpc_id,
            subnet_id=subnet_id,
        )
        self.image_id = image.image_id
        ssm.StringParameter(
            self,
            "AmiParameter",
            parameter_name=IMAGE_PARAMETER,
            string_value=image.image_id,
            data_type=ssm.ParameterDataType.AWS_EC2_IMAGE,
            description="horovod-fleet: the newest proven training AMI",
        )
        CfnOutput(self, "AmiId", value=image.image_id, description="the proven training AMI")
        CfnOutput(self, "AmiParameterName", value=IMAGE_PARAMETER)
        CfnOutput(
            self,
            "BakeLogs",
            value=Fn.join(
                "", ["/aws/imagebuilder/", BASE_NAME, " and /aws/imagebuilder/", PROVEN_NAME]
            ),
        )
