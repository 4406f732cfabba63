"""distrl: IMPALA, Ape-X, R2D2 and SEED RL from one set of shared parts."""

__version__ = "0.1.0"
