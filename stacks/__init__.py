"""The CDK side of horovod-fleet: configuration, the instance-type table and the four stacks."""
