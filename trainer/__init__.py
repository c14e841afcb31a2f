"""ResNet training on ImageNet TFRecords with TensorFlow 2 + Horovod (see trainer/train.py).

trainer/preprocess/ makes those TFRecords from the ILSVRC archives, without TensorFlow.
"""
