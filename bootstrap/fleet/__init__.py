"""What the fleet does together: rendezvous (registration, the hostfile, the head's key, the
fleet check and the ready signal), heartbeats and the head watch, the allreduce check and the
wrapper every rank runs under, and Member, the bootstrap of every node but node 0."""
