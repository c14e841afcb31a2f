"""The preprocessing node on its own: its data volume, its ready signal to PreprocessStack, and
PreprocessingNode (the raw archives converted once to verified TFRecords in S3, then a stop)."""
