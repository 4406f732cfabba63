"""A run's housekeeping: its settings and per-rank seeds, the resumed settings, checkpoint
files, the run directory lock, child-process supervision, memory checks and malloc."""
