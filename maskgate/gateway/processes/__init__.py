"""Running gateway processes: one process (serve), N sharing a port (supervisor), and how many
CPUs there are to use (cores)."""
