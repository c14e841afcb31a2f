"""The dataset's home, which outlives every other stack.

stack.py   DatasetStack: termination-protected, holds the bucket
bucket.py  DatasetBucket: the bucket (logical ID pinned), its access-log bucket, EventBridge
"""
