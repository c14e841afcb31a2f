"""`horovod-fleet`: watch a run from your terminal (status, logs, runs), see what stays billed,
and index TFRecords of your own for the fleet (`dataset index`: their shards in S3 and the
manifest.json it writes, docs/contracts.md).

Watching, it reads only what a run writes (docs/contracts.md): runs/<run>/status.json, DONE.json and
nodes/ in S3, TrainStack's outputs in CloudFormation, the log group in CloudWatch Logs. `drill`
deploys and destroys through the CDK CLI and runs the dataset's generator and converter as
processes. It never imports stacks/, bootstrap/ or trainer/; it imports contract/, the leaf every
room shares.
"""
