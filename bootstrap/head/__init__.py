"""The fleet's head: the elastic horovodrun's driver and what the run needs besides training."""
