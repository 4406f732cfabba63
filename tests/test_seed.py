"""SEED RL: the inference server against the IMPALA actor, dynamic batching, per-env
recurrent state, worker failure and restart, the agent's config errors, and learning."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import threading
import time

import pytest
import seed_envs
import torch
import torch.multiprocessing as mp
from learning import learning_seed, report
from presets import compose_preset, compose_run

from agents import impala, r2d2, seed
from distrl.acting.actor import (
    Actor,
    ActorStats,
    EnvGroup,
    PolicyOutput,
    TransitionSink,
    UnrollSink,
)
from distrl.acting.env_workers import Channels, EnvWorkers, LocalChannels, worker_seeds
from distrl.acting.inference import InferenceServer, InferenceWeights, ServerThread
from distrl.config import (
    CheckpointConfig,
    ConfigError,
    DistributedConfig,
    EnvConfig,
    LogConfig,
    ModelConfig,
    RunConfig,
)
from distrl.envs import env_seed, make_envs
from distrl.replay.writers import NStepWriter
from distrl.transport.queues import FieldSpec, SlotPool

A = seed_envs.NUM_ACTIONS
# Half the lowest calibration figure, rounded down (tests/learning.py): training 490.3 /
# 466.1 and evaluation 471.3 / 442.4 on seeds 100 / 101 at SEED_FRAMES
# (tests/learning_calibration.txt).
SEED_TRAIN, SEED_EVAL = 230.0, 220.0
SEED_FRAMES = 800_000  # the learning test's budget (IMPALA's CartPole preset: 1.2M)
T = 5  # unroll length of the server tests


def _env(name: str) -> EnvConfig:
    return EnvConfig(id=name, imports=["seed_envs"])


def _specs(columns: int, state_shapes: list[tuple[int, ...]]) -> dict[str, FieldSpec]:
    specs = {
        "observations": FieldSpec((T + 1, columns, 2), torch.float32),
        "actions": FieldSpec((T, columns), torch.int64),
        "rewards": FieldSpec((T, columns), torch.float32),
        "dones": FieldSpec((T, columns), torch.bool),
        "policy_versions": FieldSpec((T, columns), torch.int64),
        "behaviour_logits": FieldSpec((T, columns, A), torch.float32),
    }
    for i, shape in enumerate(state_shapes):
        specs[f"core_state_{i}"] = FieldSpec((columns, *shape[1:]), torch.float32,
                                             time_major=False)
    return specs


def _lstm_net() -> torch.nn.Module:
    torch.manual_seed(7)
    return impala.make_network((2,), A, ModelConfig(hidden_size=16, use_lstm=True,
                                                    lstm_size=8))


def _server(channels, pool: SlotPool, policy, model, stats: ActorStats, **kw) -> InferenceServer:
    groups = [EnvGroup(None, UnrollSink(pool, T, stats)) for _ in range(channels.num_channels)]
    return InferenceServer(channels, groups, policy, InferenceWeights(model), stats,
                           max_batch=kw.pop("max_batch", 10**6),
                           batch_timeout_s=kw.pop("batch_timeout_s", 0.0), **kw)


def _collect(pool: SlotPool, count: int, produce) -> list[dict[str, torch.Tensor]]:
    """Step ``produce`` until ``count`` unrolls are committed; their fields, in order."""
    while pool.full_count() < count:
        produce()
    indices, _ = pool.take(count)
    return [pool.gather([i]) for i in indices]


def _impala_actor_unrolls(env_cfg: EnvConfig, envs: int, groups: int, count: int,
                          policy_seed: int) -> list[dict[str, torch.Tensor]]:
    """What an IMPALA actor (id 0, run seed 0) writes with ``_lstm_net``'s weights."""
    model = _lstm_net()
    pool = SlotPool(_specs(envs, [s.shape for s in model.initial_state(envs)]), count + groups)
    stats = ActorStats()
    env_groups = [EnvGroup(make_envs(env_cfg, envs, env_seed(0, 0, g, groups, envs)),
                           UnrollSink(pool, T, stats)) for g in range(groups)]
    actor = Actor(env_groups, impala.ImpalaPolicy(model), lambda: 0, stats)
    torch.manual_seed(policy_seed)
    try:
        return _collect(pool, count, actor.step)
    finally:
        actor.close()


def _assert_same_unrolls(got, expected) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.keys() == e.keys()
        for name in e:
            assert torch.equal(g[name], e[name]), name


# ---------------------------------------------------------------- unrolls as IMPALA's


def test_server_unrolls_equal_the_impala_actors_in_one_process():
    """Serial mode: the same env seeds, weights and sampling seed give the same unrolls,
    field for field (observations, actions, rewards, dones, behaviour logits, LSTM state)."""
    env_cfg, envs, count = _env("DistrlCounter-v0"), 4, 6
    expected = _impala_actor_unrolls(env_cfg, envs, 1, count, policy_seed=3)

    model = _lstm_net()
    pool = SlotPool(_specs(envs, [s.shape for s in model.initial_state(envs)]), count + 1)
    channels = LocalChannels([make_envs(env_cfg, envs, env_seed(0, 0, 0, 1, envs))])
    server = _server(channels, pool, impala.ImpalaPolicy(model), model, ActorStats())
    torch.manual_seed(3)
    try:
        got = _collect(pool, count, server.step)
    finally:
        channels.close()
    _assert_same_unrolls(got, expected)
    # The unrolls hold episode ends and LSTM states that are not all zero: a real check.
    assert any(u["dones"].any() for u in got)
    assert any(u["core_state_0"].abs().sum() > 0 for u in got)


def test_server_unrolls_equal_the_impala_actors_with_a_worker_process():
    """An env worker process (generation 0) steps the same envs as IMPALA actor 0."""
    env_cfg, envs, count = _env("DistrlCounter-v0"), 3, 5
    expected = _impala_actor_unrolls(env_cfg, envs, 1, count, policy_seed=5)

    model = _lstm_net()
    ctx = mp.get_context("spawn")
    pool = SlotPool(_specs(envs, [s.shape for s in model.initial_state(envs)]), count + 1)
    channels = Channels(ctx, 1, envs, (2,), torch.float32)
    with EnvWorkers(ctx, 1, 1, env_cfg, 1, 0, channels) as workers:
        server = _server(channels, pool, impala.ImpalaPolicy(model), model, ActorStats(),
                         workers=workers)
        torch.manual_seed(5)
        got = _collect(pool, count, server.step)
    _assert_same_unrolls(got, expected)
    assert worker_seeds(0, 0, 1, envs, 0) == [env_seed(0, 0, 0, 1, envs)]
    assert worker_seeds(0, 0, 1, envs, 1) != worker_seeds(0, 0, 1, envs, 0)


# ---------------------------------------------------------------- batching and state


class EchoPolicy:
    """Acts with the observation's first entry (DistrlMatch's correct action) and keeps a
    per-env state h that counts steps since the episode started; records what it saw."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []  # (observations, h)

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(batch_size, 1),)

    def __call__(self, observations, core_state, last_actions=None, last_rewards=None):
        if self.delay_s:
            time.sleep(self.delay_s)
        (h,) = core_state
        self.calls.append((observations.clone(), h.clone()))
        actions = observations[:, 0].long() % A  # DistrlMatch: k itself
        logits = torch.nn.functional.one_hot(actions, A).float()
        return PolicyOutput(actions, {"behaviour_logits": logits}, (h + 1,))


def _run_workers(env_name: str, workers: int, groups: int, envs: int, steps: int,
                 policy, max_batch: int, **kw):
    ctx = mp.get_context("spawn")
    pool = SlotPool(_specs(envs, [(envs, 1)]), 10_000)
    channels = Channels(ctx, workers * groups, envs, (2,), torch.float32)
    stats = ActorStats()
    model = torch.nn.Linear(1, 1)
    with EnvWorkers(ctx, workers, groups, _env(env_name), 1, 0, channels) as env_workers:
        server = _server(channels, pool, policy, model, stats, workers=env_workers,
                         max_batch=max_batch, batch_timeout_s=0.002, **kw)
        served = 0
        while served < steps:
            served += server.step(wait_s=1.0)
        return server, stats, pool


def test_dynamic_batching_gives_every_env_its_own_action():
    """3 workers x 2 groups of 2 envs; batches of up to 6 envs mix channels of different
    workers. Any action sent to the wrong env scores 0 in DistrlMatch."""
    policy = EchoPolicy(delay_s=0.001)
    server, stats, pool = _run_workers("DistrlMatch-v0", 3, 2, 2, 3000, policy, max_batch=6)
    sizes = server.inference.batch_sizes
    # Batches of several channels (a full one of 6 envs holds 3 channels, so 2+ workers);
    # whether sizes also vary depends on the machine's load, so that is not asserted.
    assert max(sizes) <= 6 and max(sizes) > 2
    indices, _ = pool.take(pool.full_count())
    rewards = torch.cat([pool.gather([i])["rewards"].flatten() for i in indices])
    assert rewards.numel() >= 1000 and torch.all(rewards == 1.0)
    assert stats.episode_returns and all(r == 7.0 for r in stats.episode_returns)


def test_recurrent_state_is_kept_per_env_and_reset_at_episode_start():
    """The state the policy sees for each env equals its step in the episode
    (DistrlCounter's second observation entry), whatever batch the env landed in."""
    policy = EchoPolicy()
    # 4 channels of 3 envs, at most 3 channels a batch: even when every channel is always
    # ready (a loaded machine), one is left over each time and batches rotate.
    server, _, _ = _run_workers("DistrlCounter-v0", 2, 2, 3, 2000, policy, max_batch=9)
    checked = 0
    for observations, h in policy.calls:
        assert torch.equal(h[:, 0], observations[:, 1])
        checked += observations.shape[0]
    assert checked >= 2000
    # Envs met in batches of different compositions (DistrlCounter's first entry: env id).
    assert len({tuple(obs[:, 0].tolist()) for obs, _ in policy.calls}) > 1
    steps = torch.cat([obs[:, 1] for obs, _ in policy.calls])
    assert steps.max() >= 6 and (steps == 0).sum() > 100  # many episodes, long ones too


# ---------------------------------------------------------------- failures


def _assert_unroll_consistent(unroll: dict[str, torch.Tensor]) -> None:
    """DistrlCounter's closed form inside one unroll: no sentinel, the env id stays, the
    step counter advances by one or restarts at 0 after a done, reward = action + 1."""
    obs = unroll["observations"]
    assert not torch.isnan(obs).any() and not torch.isnan(unroll["rewards"]).any()
    assert (unroll["actions"] >= 0).all()
    assert torch.equal(obs[1:, :, 0], obs[:-1, :, 0])
    expected_step = torch.where(unroll["dones"], torch.zeros_like(obs[1:, :, 1]),
                                obs[:-1, :, 1] + 1)
    assert torch.equal(obs[1:, :, 1], expected_step)
    assert torch.equal(unroll["rewards"], unroll["actions"].float() + 1)


def _serve_until(server: InferenceServer, condition) -> None:
    """Serve until ``condition`` holds; the test's time limit (pytest-timeout) ends a hang."""
    while not condition():
        server.step(wait_s=0.05)
        server.check_workers()


def test_a_killed_worker_is_restarted_and_no_corrupt_unroll_reaches_the_learner():
    ctx = mp.get_context("spawn")
    envs = 2
    pool = SlotPool(_specs(envs, [(envs, 1)]), 10_000)
    channels = Channels(ctx, 2, envs, (2,), torch.float32)
    stats = ActorStats()
    with EnvWorkers(ctx, 2, 1, _env("DistrlCounter-v0"), 1, 0, channels,
                    max_restarts=3) as workers:
        server = _server(channels, pool, EchoPolicy(), torch.nn.Linear(1, 1), stats,
                         workers=workers, worker_timeout_s=30.0)
        _serve_until(server, lambda: all(server.open) and pool.full_count() >= 10)
        first_pid = workers.pids()[0]
        os.kill(first_pid, signal.SIGKILL)
        before = pool.full_count()
        _serve_until(server, lambda: server.inference.restarts == 1)
        assert workers.generations == [1, 0] and workers.pids()[0] != first_pid
        assert server.inference.dropped_unrolls == 1  # the open unroll of worker 0's channel
        # The restarted worker plays new episodes (other seeds): wait for its unrolls.
        new_seed = worker_seeds(0, 0, 1, envs, 1)[0]
        new_ids = {new_seed % 1000, (new_seed + 1) % 1000}
        unrolls: list[dict[str, torch.Tensor]] = []
        taken = 0

        def new_worker_delivered() -> bool:
            nonlocal taken
            if pool.full_count():
                indices, _ = pool.take(pool.full_count())
                taken += len(indices)
                unrolls.extend(pool.gather([i]) for i in indices)
            return any(set(u["observations"][0, :, 0].long().tolist()) == new_ids
                       for u in unrolls)

        _serve_until(server, new_worker_delivered)
        assert taken >= before
    for unroll in unrolls:
        _assert_unroll_consistent(unroll)
    # Every slot is either queued, or free, or held by one of the two open unrolls.
    assert pool.free_count() + taken + 2 == pool.num_slots


@pytest.mark.parametrize("groups", [1, 2])
def test_a_hung_worker_is_detected_by_its_timeout_and_restarted(groups):
    ctx = mp.get_context("spawn")
    envs = 2
    pool = SlotPool(_specs(envs, [(envs, 1)]), 10_000)
    channels = Channels(ctx, groups, envs, (2,), torch.float32)
    with EnvWorkers(ctx, 1, groups, _env("DistrlHang-v0"), 1, 0, channels,
                    max_restarts=3) as workers:
        server = _server(channels, pool, EchoPolicy(), torch.nn.Linear(1, 1), ActorStats(),
                         workers=workers, worker_timeout_s=1.5)
        _serve_until(server, lambda: server.inference.restarts == 1)
        # Generation 0 hung on its 5th step: the unroll each group had open was dropped.
        assert server.inference.dropped_unrolls == groups and pool.full_count() == 0
        _serve_until(server, lambda: pool.full_count() >= 5)  # generation 1 does not hang
        indices, _ = pool.take(pool.full_count())
    for i in indices:
        _assert_unroll_consistent(pool.gather([i]))


def test_a_server_waiting_on_its_learner_does_not_count_against_a_worker():
    """A worker steps its two groups once both have their actions. When the server,
    between answering the first and the second, waits on a full queue to the learner
    for longer than ``worker_timeout_s`` (SEED-R2D2's Pong run did: the learner takes
    batches only when its replay ratio lets it), the worker owes nothing yet: the wait is
    the server's, and the worker is not restarted."""
    ctx = mp.get_context("spawn")
    envs, timeout_s = 2, 1.0
    written: list[list] = [[], []]
    slow = threading.Event()

    def emit_slowly_once(batch) -> None:  # channel 1's first flush
        if not slow.is_set():
            slow.set()
            time.sleep(2 * timeout_s)
        written[1].append(batch)

    channels = Channels(ctx, 2, envs, (2,), torch.float32)
    with EnvWorkers(ctx, 1, 2, _env("DistrlCounter-v0"), 1, 0, channels,
                    max_restarts=3) as workers:
        groups = [EnvGroup(None, TransitionSink(NStepWriter(envs, n=1, discount=0.5,
                                                            frame_stack=None), 1, emit))
                  for emit in (written[0].append, emit_slowly_once)]
        # One channel per call (max_batch = one channel's envs): channel 0 is answered a
        # call before channel 1, the worker waiting for both.
        server = InferenceServer(channels, groups, EchoPolicy(), InferenceWeights(
            torch.nn.Linear(1, 1)), ActorStats(), max_batch=envs, batch_timeout_s=0.0,
            workers=workers, worker_timeout_s=timeout_s)
        waited_since_channel_0 = []
        while len(written[1]) < 5:
            served = server.step(wait_s=0.05)
            if slow.is_set() and not waited_since_channel_0:
                # What the worker-only clock read once the server's wait was over.
                waited_since_channel_0.append(time.monotonic() - server.answered_at[0])
            assert server.check_workers() == [], f"restarted after {served} envs served"
        assert waited_since_channel_0[0] > timeout_s  # channel 0 alone looked silent
        assert server.inference.restarts == 0 and workers.generations == [0]
        assert len(written[0]) >= 4


def test_a_replay_agents_hung_worker_is_restarted_and_no_transition_spans_two_generations():
    """SEED-R2D2's and SEED-Ape-X's channels write through a TransitionSink: a hung worker
    is replaced, its envs' episodes end where their last answered step left them, and
    every transition joins two steps of one env of one generation."""
    ctx = mp.get_context("spawn")
    envs = 2
    batches = []
    channels = Channels(ctx, 1, envs, (2,), torch.float32)
    with EnvWorkers(ctx, 1, 1, _env("DistrlHang-v0"), 1, 0, channels,
                    max_restarts=3) as workers:
        writer = NStepWriter(envs, n=1, discount=0.5, frame_stack=None)
        groups = [EnvGroup(None, TransitionSink(writer, 1, batches.append))]
        server = InferenceServer(channels, groups, EchoPolicy(), InferenceWeights(
            torch.nn.Linear(1, 1)), ActorStats(), max_batch=10**6, batch_timeout_s=0.0,
            workers=workers, worker_timeout_s=1.5)
        _serve_until(server, lambda: server.inference.restarts == 1)
        new_seed = worker_seeds(0, 0, 1, envs, 1)[0]
        new_ids = {float(new_seed % 1000), float((new_seed + 1) % 1000)}

        def new_generation_wrote() -> bool:
            return any(new_ids & set(b.frames[:, 0].tolist()) for b in batches)

        _serve_until(server, new_generation_wrote)
    old_ids = set(batches[0].frames[:, 0].tolist())
    assert old_ids and not old_ids & new_ids
    for batch in batches:
        now = batch.frames[batch.observation_frames[:, 0]]
        after = batch.frames[batch.next_observation_frames[:, 0]]
        assert torch.equal(after[:, 0], now[:, 0])  # the same env
        going = batch.discounts > 0  # an ended episode's next observation is not used
        assert torch.equal(after[going, 1], now[going, 1] + 1)  # its next step
        assert torch.equal(batch.returns, batch.actions.float() + 1)
        assert set(batch.discounts.tolist()) <= {0.0, 0.5}


# ---------------------------------------------------------------- the agent


def cartpole_config(tmp_path, name: str, actors: int = 2, total_frames: int = 1_200_000,
                    **agent) -> RunConfig:
    return RunConfig(
        agent=seed.SeedConfig(**agent),
        env=EnvConfig(id="CartPole-v1"),
        distributed=DistributedConfig(actors=actors, envs_per_actor=32 if actors == 0 else 16,
                                      env_groups=1),
        log=LogConfig(dir=str(tmp_path), name=name, interval_s=30.0, tensorboard=False),
        checkpoint=CheckpointConfig(interval_s=3600.0),
        seed=0,
        total_frames=total_frames,
    )


@pytest.mark.parametrize(("field", "value", "message"), [
    ("learner", "ppo", "agent.learner must be one of impala, r2d2; got 'ppo'"),
    ("device", "tpu", "agent.device must be one of auto, cpu, cuda, cuda:N; got 'tpu'"),
    ("max_inference_batch", -1, "agent.max_inference_batch must be a number >= 0, got -1"),
    ("worker_timeout_s", 0, "agent.worker_timeout_s must be a positive number, got 0"),
    ("inference_threads", -1, "agent.inference_threads must be a number >= 0, got -1"),
])
def test_bad_seed_settings_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        seed.SeedConfig(**{field: value})


def test_zero_is_a_setting_where_its_meaning_is_documented():
    # inference_threads 0: as many threads as the learner's; max_inference_batch 0:
    # all envs of the run in one inference call
    config = seed.SeedConfig(inference_threads=0, max_inference_batch=0)
    assert (config.inference_threads, config.max_inference_batch) == (0, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_device_without_a_gpu_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="agent.device is 'cuda' but torch sees no CUDA"):
        seed.run(cartpole_config(tmp_path, "cuda", actors=0, total_frames=640, device="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("learner", ["impala", "r2d2"])
def test_inference_and_training_share_the_gpu(tmp_path, learner):
    """agent.device=cuda: the server infers and the learner trains on the GPU (2 env
    worker processes); the run makes its updates and its checkpoint holds CUDA weights."""
    if learner == "impala":
        cfg = cartpole_config(tmp_path, "gpu", actors=2, total_frames=20 * 32 * 10,
                              device="cuda")
    else:
        cfg = compose_preset(tmp_path, "seed_r2d2_cartpole", "gpu", "agent.device=cuda",
                             "total_frames=3000", "agent.r2d2.learning_starts=20",
                             "agent.r2d2.batch_size=8", "distributed.actors=2",
                             "distributed.envs_per_actor=4")
    result = seed.run(cfg)
    assert result["updates"] > 0
    state = torch.load(result["checkpoint"], weights_only=False)["learner"]["model"]
    assert all(t.is_cuda for t in state.values())


def test_serial_seed_trains_like_serial_impala(tmp_path):
    """In one process SEED-IMPALA's server acts exactly as IMPALA's local actor: the same
    seed gives the same weights after 3 updates."""
    frames = 3 * 20 * 32
    seed.run(cartpole_config(tmp_path, "seed", actors=0, total_frames=frames))
    impala_cfg = dataclasses.replace(cartpole_config(tmp_path, "impala", actors=0,
                                                     total_frames=frames),
                                     agent=impala.ImpalaConfig())
    impala.run(impala_cfg)
    seed_state = torch.load(next((tmp_path / "seed" / "checkpoints").glob("*.pt")),
                            weights_only=False)["learner"]["model"]
    impala_state = torch.load(next((tmp_path / "impala" / "checkpoints").glob("*.pt")),
                              weights_only=False)["learner"]["model"]
    for name, value in impala_state.items():
        assert torch.equal(seed_state[name], value), name


# ---------------------------------------------------------------- SEED-R2D2


def test_seed_r2d2_preset_is_the_r2d2_preset_behind_central_inference(tmp_path):
    seed_cfg = compose_preset(tmp_path, "seed_r2d2_cartpole", "a")
    r2d2_cfg = compose_preset(tmp_path, "r2d2_cartpole", "b")
    assert seed_cfg.agent.learner == "r2d2" and seed_cfg.env == r2d2_cfg.env
    assert (seed_cfg.distributed, seed_cfg.total_frames) == (r2d2_cfg.distributed,
                                                             r2d2_cfg.total_frames)
    mine, theirs = dataclasses.asdict(seed_cfg.agent.r2d2), dataclasses.asdict(r2d2_cfg.agent)
    # weight_sync_steps has no meaning for SEED: inference always uses the newest weights.
    assert {k for k in mine if mine[k] != theirs[k]} == {"weight_sync_steps"}


def test_serial_seed_r2d2_fills_the_replay_as_serial_r2d2(tmp_path):
    """Before the first update (learning starts late) the weights are the same, so the
    server must write the same sequences, stored states and initial priorities as the
    R2D2 actor: the replays are bit-identical after 3,000 steps of 8 envs."""
    common = ("total_frames=3000", "agent.learning_starts=40000", "checkpoint.replay=true")
    ours = seed.run(compose_preset(tmp_path, "seed_r2d2_cartpole", "seed",
                                   *[o.replace("agent.", "agent.r2d2.") for o in common]))
    theirs = r2d2.run(compose_preset(tmp_path, "r2d2_cartpole", "r2d2", *common))
    assert ours["inserted"] == theirs["inserted"] > 200 and ours["updates"] == 0
    a = torch.load(ours["checkpoint"], weights_only=False)["replay"]
    b = torch.load(theirs["checkpoint"], weights_only=False)["replay"]

    def assert_same(x, y, where=""):
        if isinstance(x, dict):
            assert x.keys() == y.keys(), where
            for key in x:
                assert_same(x[key], y[key], f"{where}.{key}")
        elif isinstance(x, (list, tuple)):
            assert len(x) == len(y), where
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                assert_same(u, v, f"{where}[{i}]")
        elif isinstance(x, torch.Tensor):
            assert torch.equal(x, y), where
        else:
            assert x == y, where

    assert_same(a, b)


@pytest.mark.dist
def test_seed_r2d2_trains_with_two_env_worker_processes(tmp_path):
    """SEED-R2D2 end to end with 2 env workers: sequences arrive through the server's
    queue at the replay ratio, and the run does its updates and exits."""
    cfg = compose_preset(tmp_path, "seed_r2d2_cartpole", "w2", "distributed.actors=2",
                         "distributed.envs_per_actor=4", "total_frames=6000")
    result = seed.run(cfg)
    assert result["frames"] >= 6000 and result["updates"] > 50
    # 4 sampled per sequence inserted once learning started (at 100 sequences).
    credit = 4 * (result["inserted"] - 100)
    assert 0.8 * credit <= result["sampled"] <= credit + 32


@pytest.mark.dist
def test_training_goes_on_after_an_env_worker_is_killed(tmp_path, monkeypatch):
    """Kill env worker 0 at update 5 or later, once one of its envs has had an action
    answered (its unroll is open): the run restarts it, drops that partial unroll and
    keeps training; it stops 5 updates after the new worker 0 process appeared."""
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv(seed_envs.MARKER_DIR, str(markers))
    killed: list[int] = []
    restarted_at: list[int] = []

    def worker_0() -> list[int]:
        return [p.pid for p in mp.active_children() if p.name == "distrl-env-worker-0"]

    def kill_then_stop_after_the_restart(updates: int) -> bool:
        if not killed and updates >= 5:
            (pid,) = worker_0()
            if (markers / f"stepped-{pid}").exists():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        elif killed and not restarted_at and worker_0() not in ([], killed):
            restarted_at.append(updates)
        return bool(restarted_at) and updates >= restarted_at[0] + 5

    cfg = cartpole_config(tmp_path, "kill", total_frames=10**6)
    cfg.env = _env("DistrlMarked-v0")
    result = seed.run(cfg, should_stop=kill_then_stop_after_the_restart)
    assert len(killed) == 1 and restarted_at, "worker 0 was not restarted"
    assert result["updates"] == restarted_at[0] + 5
    assert result["worker_restarts"] == 1 and result["dropped_unrolls"] == 1


@pytest.mark.dist
def test_a_worker_that_keeps_failing_ends_the_run_with_its_cause(tmp_path, capfd):
    """An env that raises on its 30th step: restarted once (max_worker_restarts=1), then
    the run stops with an error naming the setting; no worker process is left behind."""
    cfg = cartpole_config(tmp_path, "crash", total_frames=10**6, max_worker_restarts=1)
    cfg.env = EnvConfig(id="DistrlCrashAfter-v0", imports=["crashing_env"])
    with pytest.raises(RuntimeError, match=r"exited with code 1: env workers would be "
                       r"restarted 2 times, more than agent\.max_worker_restarts=1"):
        seed.run(cfg)
    assert "DistrlCrashAfter-v0 crashed on purpose" in capfd.readouterr().err
    assert not [p for p in mp.active_children() if p.name.startswith("distrl-env-worker")]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.dist
def test_learns_cartpole_with_two_env_worker_processes(tmp_path):
    """SEED-IMPALA with IMPALA's CartPole settings for 800k frames (the one-process budget
    is 1.2M, cut for CI's time and calibrated at 800k), then 20 episodes of the final
    policy. Thresholds: SEED_TRAIN, SEED_EVAL (from seeds 100 and 101); runs
    seed 8."""
    run_seed = learning_seed()
    result = seed.run(compose_run(tmp_path, "workers", "agent=seed", "distributed.actors=2",
                                  "distributed.envs_per_actor=16", f"seed={run_seed}",
                                  f"total_frames={SEED_FRAMES}", "eval.episodes=20"))
    report("seed_impala_workers", run_seed, result)
    assert result["frames"] >= SEED_FRAMES
    assert result["mean_return_20"] >= SEED_TRAIN, result["returns"][-20:]
    assert result["eval_return"] >= SEED_EVAL, result["eval_returns"]


def test_the_learner_publishes_into_the_inference_model():
    """SEED's learner copies each update into the inference model, with its version."""
    model = torch.nn.Linear(2, 2)
    copy = torch.nn.Linear(2, 2)
    weights = InferenceWeights(copy)
    with torch.no_grad():
        model.weight.fill_(3.0)
    weights.publish(model, 4)
    assert weights.version == 4 and torch.equal(copy.weight, model.weight)


class _ThreadCountingServer:
    """Stands in for InferenceServer: records the torch thread count its steps run with."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def step(self, wait_s: float) -> None:
        self.threads.append(torch.get_num_threads())
        time.sleep(wait_s)

    def check_workers(self) -> list[int]:
        return []


def test_the_server_thread_runs_on_its_own_torch_thread_count(intra_op_threads):
    """With torch_threads=1 inference runs on one thread while the learner's thread keeps
    its own count, and threads started later get the learner's count, not the server's."""
    intra_op_threads(2)
    server = _ThreadCountingServer()
    with ServerThread(server, torch_threads=1):  # type: ignore[arg-type]
        while not server.threads:  # the server thread has stepped at least once
            time.sleep(0.01)
        learner_threads = torch.get_num_threads()
        later: list[int] = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
    assert server.threads and set(server.threads) == {1}
    assert learner_threads == 2 and later == [2]


def test_atari_short_seed_preset_is_atari_short_impala_behind_central_inference(tmp_path):
    """SEED's short-budget Atari preset trains IMPALA's learner with exactly the settings of
    atari_short_impala (batch, initialisation, optimizer), on the same game, budget and evaluation,
    so the two Pong runs compare like with like."""
    seed_cfg = compose_preset(tmp_path, "atari_short_seed", "a")
    plain_cfg = compose_preset(tmp_path, "atari_short_impala", "b")
    assert seed_cfg.agent.learner == "impala"
    assert seed_cfg.env == plain_cfg.env and seed_cfg.env.id == "Pong"
    assert (seed_cfg.total_frames, seed_cfg.eval) == (plain_cfg.total_frames, plain_cfg.eval)
    assert dataclasses.asdict(seed_cfg.agent.impala) == dataclasses.asdict(plain_cfg.agent)
    assert (plain_cfg.agent.passes, plain_cfg.agent.ppo_clip) == (1, None)  # IMPALA's own loss


def test_atari_short_seed_r2d2_preset_is_atari_short_r2d2_behind_central_inference(tmp_path):
    """SEED-R2D2's Atari preset trains R2D2's learner with exactly atari_short_r2d2's
    settings, on the same game, budget and evaluation."""
    seed_cfg = compose_preset(tmp_path, "atari_short_seed_r2d2", "a")
    plain_cfg = compose_preset(tmp_path, "atari_short_r2d2", "b")
    assert seed_cfg.agent.learner == "r2d2"
    assert seed_cfg.env == plain_cfg.env and seed_cfg.env.id == "Pong"
    assert (seed_cfg.total_frames, seed_cfg.eval) == (plain_cfg.total_frames, plain_cfg.eval)
    assert dataclasses.asdict(seed_cfg.agent.r2d2) == dataclasses.asdict(plain_cfg.agent)


def test_atari_short_seed_appo_preset_is_atari_short_appo_behind_central_inference(tmp_path):
    """The APPO pair of presets, likewise: SEED trains IMPALA's learner with exactly the
    settings of atari_short_appo, on the same game, budget and evaluation."""
    seed_cfg = compose_preset(tmp_path, "atari_short_seed_appo", "a")
    plain_cfg = compose_preset(tmp_path, "atari_short_appo", "b")
    assert seed_cfg.agent.learner == "impala"
    assert seed_cfg.env == plain_cfg.env and seed_cfg.env.id == "Pong"
    assert (seed_cfg.total_frames, seed_cfg.eval) == (plain_cfg.total_frames, plain_cfg.eval)
    assert dataclasses.asdict(seed_cfg.agent.impala) == dataclasses.asdict(plain_cfg.agent)
    assert (plain_cfg.agent.ppo_clip, plain_cfg.agent.passes) == (0.1, 4)
    assert plain_cfg.agent.model.init == "orthogonal"
