"""ResNet training on ImageNet TFRecords with TensorFlow 2 + Horovod (see trainer/train.py)."""
