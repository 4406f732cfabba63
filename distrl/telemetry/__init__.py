"""What a run tells: tensorboard scalars, the console progress line, process CPU and
memory, and the throughput diagnosis (which side bounds the run, by how much, advice)."""
