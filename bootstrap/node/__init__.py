"""What every instance of the training fleet runs, head and nodes alike: TrainingNode (the attempt's record,
health, data pull, identity, and the failure report), the instance-store mount, the Spot notice
watch and its logs' upload. The image check before it is bootstrap/image/manifest.py."""
