"""The papers' mathematics: V-trace (Espeholt et al. 2018), the loss terms and targets of
IMPALA, Ape-X and R2D2, epsilon-greedy exploration, TensorFlow's RMSProp and Adam."""
