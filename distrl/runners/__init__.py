"""The run, written once (``runner``), where a rank's actors run (``topology``), and each
experience family's path on the rooms below: unroll slots (``unroll_family``) or the
prioritized replay on the learner (``replay_family``, ``replay_learner``: feed, prefetch,
priority write-back), with their experience sources (actors, SEED's server, actor-only
ranks)."""
