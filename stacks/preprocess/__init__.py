"""ImageNet preprocessing on one burstable CPU node: raw/ archives in S3 to TFRecords in S3.

    stack.py         PreprocessStack: network, the node, its guard and outputs
    preprocessor.py  Preprocessor: the instance, its sc1 data volume, role, log group, ready signal
    pinned.py        Pinned: the AMI id and code URLs of the first deploy, kept by every update

The converter itself is trainer/preprocess/; bootstrap/preprocess_node.sh runs it on the node.
"""
