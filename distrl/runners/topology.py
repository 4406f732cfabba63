"""Where a rank's actors run, decided once per run (:func:`decide`) and read by the
runner, the experience sources and the actor-only ranks: in this process, taking turns
with the learner (``distributed.actors=0``); in spawned actor processes (or SEED's env
workers); on actor-only ranks that send their slots over torch.distributed; and whether
SEED's inference server acts for every env."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.multiprocessing as mp

from distrl.run.run_settings import RunSettings
from distrl.transport import distributed
from distrl.validation import ConfigError


@dataclass(frozen=True)
class Topology:
    """A rank's place in the run (see :func:`decide`)."""

    actor_processes: int  # actor (or env worker) processes of this rank; 0: in this process
    spawn_context: Any  # their multiprocessing context; None when there are none
    remote_ranks: tuple[int, ...]  # actor-only ranks that send this learner their slots
    actor_only: bool  # this rank learns nothing: it sends its slots to its learner rank
    central_inference: bool  # SEED: the learner's process acts for every env

    @property
    def in_process(self) -> bool:
        """The actor (or SEED's envs) steps in this process, in turn with the learner."""
        return self.actor_processes == 0

    @property
    def serial(self) -> bool:
        """Actors and learner take turns in one process and nothing else feeds it (the
        throughput meter reads the sides' times as shares of one process's time)."""
        return self.in_process and not self.remote_ranks

    @property
    def senders(self) -> int:
        """Ranks whose actors reach this rank through slots: the actor-only ranks feeding a
        learner, or the learner an actor-only rank sends to."""
        return len(self.remote_ranks) + int(self.actor_only)


def decide(settings: RunSettings, ranks: distributed.RankInfo | None,
           central_inference: bool, agent: str) -> Topology:
    """The topology ``distributed.*`` and torchrun's ranks describe for this rank of
    ``agent``'s run; actor-only ranks are refused to SEED, whose env workers stay beside
    the learner that serves their inference."""
    actors = settings.distributed.actors
    actor_only = ranks is not None and not ranks.is_learner
    remote = tuple(ranks.actor_ranks_of(ranks.rank)) if ranks is not None and not actor_only \
        else ()
    if central_inference and (actor_only or remote):
        raise ConfigError(
            f"distributed.learner_ranks: actor-only ranks run actors with a policy copy "
            f"(IMPALA, Ape-X, R2D2); agent={agent} keeps its env workers on the learner's "
            "host, so launch it with every rank a learner (distributed.learner_ranks=0)")
    return Topology(actors, mp.get_context("spawn") if actors > 0 else None, remote,
                    actor_only, central_inference)
