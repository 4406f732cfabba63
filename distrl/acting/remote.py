"""Actor-only ranks: experience from other machines, weights back by broadcast.

The original IMPALA and Ape-X topology puts actors on other hosts than the learner. Under
torchrun with ``distributed.learner_ranks=K``, ranks ``K..W-1`` only act: each runs the
agent's usual actors (in its process or in actor processes) and streams what they fill,
one slot at a time, to its learner rank, ``(rank - K) % K``. Both sides hold the same
preallocated :class:`~distrl.transport.queues.SlotPool` layout, so a slot travels as one
``send``/``recv`` per field straight from the actor rank's slot into a free slot of the
learner's pool, where the learner takes it like one its own actors filled.

Each exchange, on the pair's own gloo group, is:

1. actor rank -> learner: ``[episodes, frames]``, the finished episodes' returns and
   lengths, then the slot's fields in name order;
2. learner -> actor rank, by ``dist.broadcast``: ``[stop, version]``, then the flat
   weights of that version if the actor rank has an older one.

The actor rank stops when the learner says so; a learner whose pool is full makes its
actor ranks wait (back-pressure, as local actors wait for a free slot).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from distrl.acting.actor import ActorStats
from distrl.transport.distributed import RankInfo
from distrl.transport.queues import SlotPool
from distrl.transport.weights import WeightStore

STOP_JOIN_S = 60.0  # how long a stopping learner waits for each actor rank's last exchange


class _PairLink:
    """The messages of one learner / actor-rank pair (see the module docstring)."""

    def __init__(self, peer: int, group: dist.ProcessGroup, learner: int):
        self.peer = peer  # the other side's global rank
        self.group = group
        self.learner = learner  # global rank that broadcasts

    def send(self, tensor: torch.Tensor) -> None:
        dist.send(tensor, self.peer, group=self.group)

    def recv(self, tensor: torch.Tensor) -> None:
        dist.recv(tensor, self.peer, group=self.group)

    def send_slot(self, pool_buffers: dict[str, torch.Tensor], index: int) -> None:
        for name in sorted(pool_buffers):
            self.send(pool_buffers[name][index])

    def recv_slot(self, buffers: dict[str, torch.Tensor], index: int | None) -> None:
        """Into slot ``index`` of ``buffers``, or into the single-slot ``buffers`` itself."""
        for name in sorted(buffers):
            self.recv(buffers[name] if index is None else buffers[name][index])

    def broadcast(self, tensor: torch.Tensor) -> None:
        dist.broadcast(tensor, self.learner, group=self.group)


def _episodes_tensor(stats: ActorStats) -> torch.Tensor:
    return torch.tensor(list(zip(stats.episode_returns, stats.episode_lengths, strict=True)),
                        dtype=torch.float64).reshape(-1, 2)


class LearnerConnection:
    """An actor-only rank's side: receives the first weights, then sends slots and takes
    back a stop flag and newer weights after each."""

    def __init__(self, ranks: RankInfo, store_flat_numel: int):
        assert not ranks.is_learner
        learner = ranks.learner_of(ranks.rank)
        self.rank = ranks.rank
        self.link = _PairLink(learner, ranks.pair_groups[ranks.rank], learner)
        self.control = torch.zeros(2, dtype=torch.int64)
        self.flat = torch.zeros(store_flat_numel, dtype=torch.float32)
        self.version = -1
        self.sent = 0

    def first_weights(self, store: WeightStore) -> None:
        """Wait for the learner's weights and put them in ``store`` before any actor acts."""
        self._take_reply(store)

    def send(self, buffers: dict[str, torch.Tensor], index: int, stats: ActorStats,
             store: WeightStore) -> bool:
        """Send slot ``index`` with the episodes in ``stats``; publish newer weights into
        ``store``. Returns False when the learner asks this rank to stop."""
        episodes = _episodes_tensor(stats)
        self.link.send(torch.tensor([episodes.shape[0], stats.frames], dtype=torch.int64))
        if episodes.shape[0]:
            self.link.send(episodes)
        self.link.send_slot(buffers, index)
        self.sent += 1
        return self._take_reply(store)

    def _take_reply(self, store: WeightStore) -> bool:
        self.link.broadcast(self.control)
        stop, version = (int(v) for v in self.control)
        if version > self.version:
            self.link.broadcast(self.flat)
            store.publish_flat(self.flat, version)
            self.version = version
        return not stop


class RemoteActors:
    """A learner rank's side: one thread per attached actor-only rank that receives its
    slots into ``pool`` (committed as full, for the learner loop to take) and answers with
    the stop flag and, when newer, the weights published in ``store``.

    Use as a context manager around the learner loop; :meth:`drain` returns the remote
    actors' finished episodes and frames, :meth:`check` raises if a link failed.
    """

    def __init__(self, ranks: RankInfo, pool: SlotPool, store: WeightStore):
        self.ranks = ranks
        self.pool = pool
        self.store = store
        self.actor_ranks = ranks.actor_ranks_of(ranks.rank)
        # Where a slot goes once the learner stopped taking them: received, then dropped.
        self.scratch = {name: torch.empty_like(buf[0]) for name, buf in pool.buffers.items()}
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.stats = ActorStats()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._serve, args=(a,), daemon=True,
                                         name=f"remote-actor-rank-{a}")
                        for a in self.actor_ranks]

    def __enter__(self) -> RemoteActors:
        for thread in self.threads:
            thread.start()
        return self

    def _serve(self, actor_rank: int) -> None:
        link = _PairLink(actor_rank, self.ranks.pair_groups[actor_rank], self.ranks.rank)
        sent_version = -1
        header = torch.zeros(2, dtype=torch.int64)
        try:
            while True:
                stop = self.stopping.is_set()  # decided once: what the reply says is done
                sent_version = self._reply(link, sent_version, stop)
                if stop:
                    return
                link.recv(header)
                episodes, frames = (int(v) for v in header)
                returns = torch.zeros(episodes, 2, dtype=torch.float64)
                if episodes:
                    link.recv(returns)
                index = self._free_slot()
                link.recv_slot(self.scratch if index is None else self.pool.buffers, index)
                if index is not None:
                    self.pool.commit(index)
                with self.lock:
                    self.stats.absorb(ActorStats(
                        frames=frames, episode_returns=returns[:, 0].tolist(),
                        episode_lengths=[int(n) for n in returns[:, 1].tolist()]))
        except BaseException as error:  # reported to the learner loop by check()
            if not self.stopping.is_set():
                self.errors.append(error)

    def _reply(self, link: _PairLink, sent_version: int, stop: bool) -> int:
        newest = self.store.snapshot(sent_version)
        version = newest[0] if newest is not None else sent_version
        link.broadcast(torch.tensor([int(stop), version]))
        if newest is not None:
            link.broadcast(newest[1])
        return version

    def _free_slot(self) -> int | None:
        """A free slot of the pool, or None once the learner stopped (drop the slot)."""
        while not self.stopping.is_set():
            try:
                index, _ = self.pool.acquire(timeout=0.5)
                return index
            except queue.Empty:  # the learner has not freed one yet
                continue
        return None

    def drain(self) -> list[ActorStats]:
        """The remote actors' episodes and frames since the last call."""
        with self.lock:
            return [self.stats.drain()] if self.threads else []

    def check(self) -> None:
        """Raise if a link to an actor-only rank failed."""
        if self.errors:
            raise RuntimeError(f"actor-only rank link failed: {self.errors[0]!r}") \
                from self.errors[0]

    def __exit__(self, *exc: Any) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=STOP_JOIN_S)


def serve_actor_rank(connection: LearnerConnection, store: WeightStore,
                     filled_slots: Iterator[tuple[dict[str, torch.Tensor], int]],
                     release: Callable[[int], None],
                     drain_stats: Callable[[], list[ActorStats]]) -> int:
    """An actor-only rank's loop (after :meth:`LearnerConnection.first_weights`): send
    every slot ``filled_slots`` yields, then ``release`` it, until the learner says stop.
    Returns the number of slots sent."""
    start = time.monotonic()
    for buffers, index in filled_slots:
        stats = ActorStats()
        for part in drain_stats():
            stats.absorb(part)
        go_on = connection.send(buffers, index, stats, store)
        release(index)
        if not go_on:
            break
    print(f"[distrl] actor rank {connection.rank}: sent {connection.sent} slots to learner "
          f"rank {connection.link.peer} in {time.monotonic() - start:.0f} s", flush=True)
    return connection.sent
