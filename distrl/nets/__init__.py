"""The agents' networks: torsos (CNNs, MLP), the LSTM core and the actor-critic and
(dueling) Q heads, and a side thread for a CPU learner's target-network pass."""
