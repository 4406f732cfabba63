"""Learning: the optimizer step (Learner), the one training loop and its Feed, what an
agent plugs in (agent parts), a learner rank's set-up, its run directory, auto sizing."""
