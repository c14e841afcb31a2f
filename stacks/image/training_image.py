"""TrainingImage: the two-stage Image Builder bake of the training AMI (see stacks/image/)."""

import hashlib
from collections.abc import Sequence
from pathlib import Path

from aws_cdk import (
    CrossStackReferences,
    IgnoreMode,
    ReferenceStrength,
    RemovalPolicy,
    Stack,
)
from aws_cdk import aws_iam as iam
from aws_cdk import aws_imagebuilder as imagebuilder
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from contract.names import PROJECT, PROJECT_TAG
from stacks.config_values import Placement
from stacks.image.infrastructure import BakeInfrastructure
from stacks.image.recipe import (
    BASE_NAME,
    BUILD_INSTANCE_TYPE,
    JIT_NAME,
    JIT_TIMEOUT_S,
    PROOF_DIR,
    PROOF_TIMEOUT_S,
    PROVEN_NAME,
    RECIPE,
    RECIPE_DIR,
    SOURCE_DIR,
    TRAINER_DIR,
    UBUNTU_PARENT,
    component_document,
    read_pins,
    semantic_version,
    tree_sha256,
)
from stacks.image_root import IMAGE_ROOT_GIB
from stacks.instance_types import GpuType, JitProofType
from stacks.nag import acknowledge_managed_policy
from stacks.node_code import CODE_EXCLUDE

KEEP_IMAGES = 2
LIFECYCLE_POLICY = "service-role/EC2ImageBuilderLifecycleExecutionPolicy"


def jit_digest(proof_sha256: str, jit_type: JitProofType) -> str:
    """The JIT stage's content: the proven image's, and the type it warms its cache on."""
    return hashlib.sha256(f"{proof_sha256}\n{jit_type.name}".encode()).hexdigest()


class TrainingImage(Construct):
    """The two-stage bake, and with `jit_type` a third stage on an H100/H200 type that warms a CUDA
    JIT cache into the proven image. `image_id` is the last stage's AMI."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        test_type: GpuType,
        revision: int,
        placement: Placement,
        jit_type: JitProofType | None = None,
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
        proof_tree, trainer_tree = tree_sha256(PROOF_DIR), tree_sha256(TRAINER_DIR)
        # The proof's content: its scripts, the trainer it runs, the type it runs on, and the
        # base image it starts from (a new base means a new proof).
        proof_sha256 = hashlib.sha256(
            "\n".join([base_sha256, proof_tree, trainer_tree, test_type.name]).encode()
        ).hexdigest()
        recipe_asset = self._asset("Recipe", RECIPE_DIR, self.recipe_sha256)
        proof_asset = self._asset("Proof", PROOF_DIR, proof_tree)
        trainer_asset = self._asset("Trainer", TRAINER_DIR, trainer_tree)
        bake = BakeInfrastructure(
            self,
            "Bake",
            placement=placement,
            assets=[recipe_asset, proof_asset, trainer_asset],
        )
        base_version = semantic_version(base_sha256)
        components = [
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
        proof_component = self._component(
            "gpu-proof",
            semantic_version(proof_sha256),
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
        base = self._image(
            "Base",
            name=BASE_NAME,
            version=base_version,
            parent=UBUNTU_PARENT,
            components=components,
            infrastructure=bake.configuration(
                "BuildInfrastructure", BASE_NAME, BUILD_INSTANCE_TYPE
            ),
            content_sha256=base_sha256,
        )
        proven = self._image(
            "Proven",
            name=PROVEN_NAME,
            version=semantic_version(proof_sha256),
            parent=base.attr_image_id,
            components=[proof_component],
            infrastructure=bake.configuration("GpuInfrastructure", PROVEN_NAME, test_type.name),
            content_sha256=proof_sha256,
        )
        final, names = proven, [BASE_NAME, PROVEN_NAME]
        # The last stage's name and version: what TrainStack's image check expects ImageStack to
        # hold (stacks/train/image_check.py); they change exactly when that image's content does.
        self.version = f"{PROVEN_NAME}/{semantic_version(proof_sha256)}"
        if jit_type is not None:
            final = self._jit_stage(
                jit_type, proven, proof_sha256, bake, proof_asset, trainer_asset, proof_script
            )
            names.append(JIT_NAME)
            self.version = f"{JIT_NAME}/{semantic_version(jit_digest(proof_sha256, jit_type))}"
        # Weak whatever the app's default: a fleet reads the AMI id when it deploys, so ImageStack
        # can bake a new image while a fleet runs (a strong export in use could not change).
        CrossStackReferences.of(final).produce(ReferenceStrength.WEAK)
        self.image_id = final.attr_image_id
        self._lifecycle(names)

    def _jit_stage(
        self,
        jit_type: JitProofType,
        proven: imagebuilder.CfnImage,
        proof_sha256: str,
        bake: BakeInfrastructure,
        proof_asset: s3_assets.Asset,
        trainer_asset: s3_assets.Asset,
        proof_script: str,
    ) -> imagebuilder.CfnImage:
        """The proven image on one H100/H200 instance: the trainer's ResNet-50 started cold and
        warm (bootstrap/image_proof/jit_cache.py), the caches that made it faster kept in the
        image; its test phase boots the result and tags it."""
        jit_sha256 = jit_digest(proof_sha256, jit_type)
        component = self._component(
            "gpu-jit-cache",
            semantic_version(jit_sha256),
            component_document(
                name=f"{PROJECT}-gpu-jit-cache",
                description=f"CUDA JIT cache on {jit_type.name}: ResNet-50 started cold and "
                "warm, the cache kept when the warm start is faster",
                fetch=[(proof_asset, "bootstrap/image_proof"), (trainer_asset, "trainer")],
                build=f"bash {proof_script} jit {jit_type.gpus} {jit_type.name}",
                check=f"bash {proof_script} jit-validate",
                test=f"bash {proof_script} tag",
                timeout_s=JIT_TIMEOUT_S,
            ),
        )
        return self._image(
            "Jit",
            name=JIT_NAME,
            version=semantic_version(jit_sha256),
            parent=proven.attr_image_id,
            components=[component],
            infrastructure=bake.configuration("JitInfrastructure", JIT_NAME, jit_type.name),
            content_sha256=jit_sha256,
        )

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
                        volume_size=IMAGE_ROOT_GIB,
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
            PROJECT_TAG: PROJECT,
            f"{PROJECT}:content-sha256": content_sha256,
            f"{PROJECT}:recipe-sha256": self.recipe_sha256,
            f"{PROJECT}:nvidia-driver": f"{pins['NVIDIA_DRIVER_BRANCH']}-server",
            f"{PROJECT}:cuda": pins["CUDA_VERSION"],
            f"{PROJECT}:nccl": pins["NCCL_VERSION"],
            f"{PROJECT}:efa-installer": pins["EFA_INSTALLER_VERSION"],
            f"{PROJECT}:tensorflow": pins["TENSORFLOW_VERSION"],
            f"{PROJECT}:horovod": pins["HOROVOD_VERSION"],
        }

    def _lifecycle(self, names: Sequence[str]) -> None:
        role = iam.Role(
            self,
            "LifecycleRole",
            assumed_by=iam.ServicePrincipal("imagebuilder.amazonaws.com"),
            description="horovod-fleet: deregisters training images beyond the newest two",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(LIFECYCLE_POLICY)],
        )
        acknowledge_managed_policy(
            role,
            LIFECYCLE_POLICY,
            "The policy Image Builder's lifecycle management is documented with; its EC2 "
            "actions apply only to resources tagged CreatedBy=EC2 Image Builder.",
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
                    for name in names
                ]
            ),
        )
