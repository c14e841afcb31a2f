"""`horovod-fleet`: watch a run from your terminal (status, logs, runs), see what stays billed,
and index TFRecords of your own for the fleet (`dataset index`: their shards in S3 and the
manifest.json it writes, docs/contracts.md).

Watching, it reads only what a run writes (docs/contracts.md): runs/<run>/status.json, DONE.json and
nodes/ in S3, TrainStack's outputs in CloudFormation, the log group in CloudWatch Logs. It never
imports stacks/, bootstrap/ or trainer/.
"""
