"""Several processes as one engine: a rank's place in its tensor-parallel group, the world layout
read from flags and LeaderWorkerSet's variables, the rank processes, and the step broadcast."""
