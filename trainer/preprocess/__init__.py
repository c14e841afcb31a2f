"""The ImageNet converter: ILSVRC archives to sharded TFRecords and manifest.json.

It runs on the preprocessing node, once, before any training, and needs no TensorFlow: nothing
in this package imports it at module level (a test imports every module with TensorFlow blocked).
This file imports nothing, so `import trainer.preprocess.sample` stays light.

    python -m trainer.preprocess --train-tar ... --val-tar ... --val-labels ... --output DIR_OR_S3
    python -m trainer.preprocess.sample --output DIR [--classes 10] [--quirks]
    python -m trainer.preprocess.bench [--images 2000]     # make bench-preprocess

__main__.py   the command line: flags, their checks, one `error:` line per failure
convert.py    the pipeline: blocks to a worker pool, shards written in order, resume, manifest last
archives.py   the ILSVRC tars read in place, local or s3://, by byte range
devkit.py     the validation labels from the devkit's archive (meta.mat, the ground truth)
matfile.py    MATLAB Level 5 MAT-files (the devkit's meta.mat) in plain Python
blocks.py     the inputs cut into units, and units into blocks that each own a range of shards
images.py     a worker's work: decode, resize, re-encode one image into a record
jpeg.py       the fast path for sequential YCbCr JPEGs (libjpeg-turbo scaling, OpenCV resize)
records.py    TFRecord framing and tf.train.Example encoding without TensorFlow
output.py     shards and their sidecars in a directory or under s3://, and the manifest
sample.py     small ILSVRC-shaped archives for the tests, the benchmarks and the rehearsal
bench.py      images/s per core against the TensorFlow reference recipe (imports TensorFlow lazily)
"""
