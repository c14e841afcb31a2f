"""DatasetStack: the bucket that outlives every other stack (raw archives, TFRecords, runs)."""

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from stacks.dataset.bucket import DatasetBucket


class DatasetStack(Stack):
    """Termination-protected home of the dataset bucket; `cdk destroy` never removes the data."""

    def __init__(self, scope: Construct, construct_id: str, *, bucket_name: str, **kwargs) -> None:
        super().__init__(scope, construct_id, termination_protection=True, **kwargs)
        self.bucket = DatasetBucket(self, "Dataset", bucket_name=bucket_name).bucket
        CfnOutput(
            self,
            "RawUpload",
            description="Upload the ImageNet archives here before deploying PreprocessStack",
            value=f"s3://{self.bucket.bucket_name}/raw/",
        )
