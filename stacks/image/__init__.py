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
3. Only with -c imageJitInstanceType: `horovod-fleet-training-jit`, on the proven image, on one
   H100/H200 instance: the JIT proof of bootstrap/image_proof/jit_cache.py starts ResNet-50 cold
   and warm and keeps the CUDA JIT cache (and TensorFlow's XLA cache) where they made the start
   faster; the fleet then boots from this image.
A failed step or check fails the image, the deploy, and every stack that depends on it.

    stack.py           ImageStack: the proven AMI, the SSM parameter nodes and TrainStack read
    training_image.py  TrainingImage: both stages' components, recipes, images, lifecycle policy
    infrastructure.py  BakeInfrastructure: subnet, security group, role, per-type configurations
    recipe.py          the steps, content-derived versions, AWSTOE documents, the bake estimate

Versions follow content: every component and recipe version is derived from the sha256 of the
files it runs, so a new image is baked when, and only when, those files change.
"""
