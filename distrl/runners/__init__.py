"""Runs of each experience family, written on the rooms below: experience sources
(actors, SEED's server, actor-only ranks), the replay on the learner (its feed, prefetch
and priority write-back) and the unroll and replay runners the agents call."""
