"""`horovod-fleet`: watch a run from your terminal (status, logs, runs).

It reads only what a run writes (docs/contracts.md): runs/<run>/status.json, DONE.json and
nodes/ in S3, TrainStack's outputs in CloudFormation, the log group in CloudWatch Logs. It never
imports stacks/, bootstrap/ or trainer/.
"""
