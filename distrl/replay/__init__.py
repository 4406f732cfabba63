"""Replay for the value-based agents (Ape-X, R2D2): storage, priorities, sampling, writers."""
