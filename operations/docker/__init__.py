"""The Docker daemon as the docker step leaves it, and whether this run restarts it (pure: the docker step writes
and restarts, the rank step plans the ranks that restart stops)."""
