"""Several gateway processes on one port: the leader, its middlewares, the mirrored control
state."""
