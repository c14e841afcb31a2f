"""The training image's root volume: the image bakes it at this size, and the nodes' and the
head's roots start from its snapshot. A leaf, so that the estimates read it without importing
the image's CDK code."""

IMAGE_ROOT_GIB = (
    60  # CUDA, the NCCL build, ~10 GB of TensorFlow and CUDA wheels; nodes' roots are bigger
)
