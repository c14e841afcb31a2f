"""The training fleet of one run.

stack.py  TrainStack: network, fleet, the run's guard and outputs
fleet.py  GpuFleet: the placement-grouped nodes, their security group, role, launch template
"""
