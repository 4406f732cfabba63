"""Acting: the actor loop over env groups, actor processes, SEED's env workers and
inference server, actor-only ranks' slots, and the final evaluation."""
