"""What crosses processes and ranks: shared-memory slot pools, the versioned weight
store, and torchrun's ranks, gradient averaging and per-update agreement."""
