"""Data-parallel learners under torchrun: process-group setup from torchrun's environment,
gradient averaging across learner ranks, and weight broadcast from rank 0.

``torchrun --standalone --nproc_per_node=N run.py ...`` sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and the rendezvous address; :func:`init_from_env` joins that group with
NCCL when every rank has a GPU of its own and gloo otherwise. Gradients are averaged
with one all-reduce per bucket (:class:`GradientAverager`), so after each update the
parameters are identical on every rank; rank 0's weights are broadcast at start
(:func:`broadcast_parameters`).
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  (before any process group: see init_from_env)
from torch import nn
from torch.distributed import rendezvous

from distrl.validation import ConfigError

BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket size


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the job: ranks ``0..learners-1`` learn (their gradients
    are averaged over ``group``), ranks ``learners..world_size-1`` only act and talk to
    their learner over their own gloo pair group (:mod:`distrl.acting.remote`)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str  # "nccl" or "gloo"
    learners: int = 0  # 0: every rank learns
    group: Any = None  # the learners' process group; None: the default (every rank)
    pair_groups: dict[int, Any] = field(default_factory=dict)  # actor rank -> its pair's

    def __post_init__(self) -> None:
        if self.learners == 0:
            object.__setattr__(self, "learners", self.world_size)

    @property
    def is_main(self) -> bool:
        """Rank 0 writes tensorboard and the model checkpoint."""
        return self.rank == 0

    @property
    def is_learner(self) -> bool:
        return self.rank < self.learners

    def learner_of(self, actor_rank: int) -> int:
        """The learner rank an actor-only rank streams to: actor ranks take turns."""
        return (actor_rank - self.learners) % self.learners

    def actor_ranks_of(self, learner: int) -> list[int]:
        return [a for a in range(self.learners, self.world_size) if self.learner_of(a) == learner]


def launched_by_torchrun() -> bool:
    """True when torchrun (or another launcher) set ``WORLD_SIZE`` above 1."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def local_rank_from_env() -> int | None:
    """This process's ``LOCAL_RANK`` under torchrun (its GPU on a host with several), None
    for a single-process run; readable before the process group exists."""
    return int(os.environ.get("LOCAL_RANK", "0")) if launched_by_torchrun() else None


def choose_backend(world_size_on_host: int) -> str:
    """NCCL when this host has a GPU for every local rank, else gloo (CPU tensors)."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size_on_host:
        return "nccl"
    return "gloo"


def init_from_env(timeout_s: float = 300.0, learner_ranks: int = 0) -> RankInfo | None:
    """Join torchrun's process group, or return None for a single-process run.

    ``timeout_s`` bounds every collective: a rank whose peer died raises instead of
    hanging forever (torchrun then ends the whole job). ``learner_ranks`` (0: all) makes
    the ranks from that one on actor-only; then the learners get a process group of their
    own, and every actor rank a gloo group with its learner (every rank creates every
    group, in the same order, as ``new_group`` requires).
    """
    if not launched_by_torchrun():
        return None
    world = int(os.environ["WORLD_SIZE"])
    if not 0 <= learner_ranks <= world:
        raise ConfigError(f"distributed.learner_ranks must be 0 (every rank learns) or "
                          f"1..{world} (the torchrun world size), got {learner_ranks}")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    backend = choose_backend(local_world)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    timeout = datetime.timedelta(seconds=timeout_s)
    # torch.distributed.nn.functional takes ``group.WORLD`` as a default argument when it
    # is first imported (torch._dynamo imports it, lazily, at the first optimizer step).
    # Imported after init it would pin the default group past destroy_process_group, and
    # gloo's worker threads, still alive at interpreter exit, abort the process now and
    # then (std::terminate while freeing a tensor without the GIL). It is imported at the
    # top of this module, so those defaults hold None.
    if not dist.is_initialized():
        # torchrun keeps one store across the restarts of its worker group
        # (--max-restarts): a restarted rank would read the dead ranks' addresses left in
        # it and fail to connect. Each start keys its groups under its own attempt.
        store, rank, world = next(rendezvous("env://", timeout=timeout))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(backend, store=dist.PrefixStore(f"distrl-start-{attempt}",
                                                                store),
                                rank=rank, world_size=world, timeout=timeout)
    learners = learner_ranks or world
    info = RankInfo(dist.get_rank(), world, local_rank, backend, learners)
    if learners == world:
        return info
    group = dist.new_group(list(range(learners)), timeout=timeout)
    pairs = {a: dist.new_group(sorted({info.learner_of(a), a}), timeout=timeout,
                               backend="gloo")
             for a in range(learners, world)}
    return RankInfo(info.rank, world, local_rank, backend, learners, group, pairs)


def shutdown() -> None:
    """Leave the process group (on success, error or SIGTERM alike)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_parameters(model: nn.Module, src: int = 0, group: dist.ProcessGroup | None = None
                         ) -> None:
    """Overwrite every rank's parameters and buffers with rank ``src``'s."""
    with torch.no_grad():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src, group=group)


def resync_parameters(model: nn.Module, info: RankInfo) -> float:
    """Overwrite every learner's parameters and buffers with rank 0's and return the
    largest absolute difference this rank had (0 while the ranks stayed identical, as
    averaged gradients keep them; a drift shows up here before it matters)."""
    drift = 0.0
    with torch.no_grad():
        for tensor in model.state_dict().values():
            theirs = tensor.clone()
            dist.broadcast(theirs, 0, group=info.group)
            if tensor.is_floating_point():
                drift = max(drift, float((theirs - tensor).abs().max()) if tensor.numel() else 0.0)
            tensor.copy_(theirs)
    return drift


class GradientAverager:
    """Averages ``.grad`` over the ranks of ``group`` after backward: gradients are packed
    into flat buckets of at most ``bucket_bytes`` and all-reduced (SUM, then divided by
    the world size), as DistributedDataParallel does.

    With a loss that averages over the batch, each rank's step then equals one step on
    the concatenation of every rank's batch; with a loss that sums over the batch
    (IMPALA's), it equals that step with the loss divided by the world size.
    """

    def __init__(self, model: nn.Module, group: dist.ProcessGroup | None = None,
                 bucket_bytes: int = BUCKET_BYTES):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.buckets: list[list[nn.Parameter]] = []
        bucket: list[nn.Parameter] = []
        size = 0
        for p in self.params:
            nbytes = p.numel() * p.element_size()
            if bucket and size + nbytes > bucket_bytes:
                self.buckets.append(bucket)
                bucket, size = [], 0
            bucket.append(p)
            size += nbytes
        if bucket:
            self.buckets.append(bucket)
        self.last_s = 0.0  # seconds the last call spent in all-reduce

    def __call__(self, model: nn.Module) -> None:
        start = time.perf_counter()
        for bucket in self.buckets:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
            flat /= self.world_size
            offset = 0
            for p in bucket:
                n = p.numel()
                p.grad = flat[offset:offset + n].view_as(p).clone()
                offset += n
        self.last_s = time.perf_counter() - start


def from_rank_0(value: object, info: RankInfo | None) -> object:
    """Rank 0's ``value`` on every rank (e.g. the run directory it chose)."""
    if info is None:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=info.group)
    return box[0]


def mean_over_ranks(value: float, info: RankInfo | None) -> float:
    """The mean of ``value`` over all ranks, NaN while any rank has NaN (e.g. fewer than
    20 finished episodes); without a process group, ``value`` itself."""
    if info is None:
        return value
    finite = value == value
    pair = torch.tensor([value if finite else 0.0, 1.0 if finite else 0.0], dtype=torch.float64)
    dist.all_reduce(pair, op=dist.ReduceOp.SUM, group=info.group)
    return float(pair[0] / info.learners) if int(pair[1]) == info.learners else float("nan")


@dataclass(frozen=True)
class Agreement:
    """What every learner rank decides together after an update (training loop)."""

    stop: bool  # any rank asked to stop (signal, budget, should_stop)
    checkpoint: bool  # rank 0's clock says a checkpoint is due
    frames: int  # env frames of all ranks together
    mean_return_20: float  # mean over ranks of each one's last-20 mean; NaN while any is NaN


def agree(stop: bool, checkpoint_due: bool, frames: int, mean_return_20: float,
          info: RankInfo | None) -> Agreement:
    """One small all-reduce per update that keeps ranks in step: they stop together, write
    their checkpoint shards at the same update and see the same totals. Without a process
    group, the local values."""
    if info is None:
        return Agreement(stop, checkpoint_due, frames, mean_return_20)
    finite = mean_return_20 == mean_return_20
    values = torch.tensor([
        1.0 if stop else 0.0,
        1.0 if checkpoint_due and info.is_main else 0.0,
        float(frames),
        mean_return_20 if finite else 0.0,
        1.0 if finite else 0.0,
    ], dtype=torch.float64)
    dist.all_reduce(values, op=dist.ReduceOp.SUM, group=info.group)
    all_finite = int(values[4]) == info.learners
    return Agreement(
        stop=bool(values[0] > 0), checkpoint=bool(values[1] > 0), frames=int(values[2]),
        mean_return_20=float(values[3] / info.learners) if all_finite else float("nan"))


def barrier(info: RankInfo | None) -> None:
    """Wait until every rank got here (e.g. every replay shard is written); a no-op alone."""
    if info is not None:
        dist.barrier(group=info.group)
