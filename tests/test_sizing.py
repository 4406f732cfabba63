"""Auto sizing (distrl.training.sizing): the cost model's choices on hand-computed cases, the
measurement's units, and ``auto`` resolved in a run's settings."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from distrl.config import CheckpointConfig, ConfigError, DistributedConfig, EnvConfig, LogConfig
from distrl.nets.torsos import ShallowCNN
from distrl.run.run_settings import RunSettings
from distrl.training import sizing

US = 1e-6


def costs(env: float, forward: float, learn: dict[int, float]) -> sizing.Costs:
    return sizing.Costs(env * US, forward * US, {t: v * US for t, v in learn.items()})


def test_two_core_pong_costs_choose_one_actor_and_one_learner_thread() -> None:
    # Pong IMPALA's per-frame costs on 2 cores: env 83, forward 25, learner 86 us on one
    # thread and 53 on two. One thread: min(1/86us, 2/(83+25+86)us) = 10,309 frames/s;
    # two: min(1/53us, 2/(83+25+106)us) = 9,346. Actors need 10,309 x 108us = 1.11 cores,
    # which one actor of two env groups gives: it keeps (83+25)/83 = 1.30 cores busy.
    top = sizing.choose_topology(costs(83, 25, {1: 86, 2: 53}), cores=2, batch_size=32,
                                 central_inference=False)
    assert (top.actors, top.envs_per_actor, top.env_groups, top.learner_threads) == (1, 64, 2, 1)
    assert top.predicted_fps == pytest.approx(2 / (194 * US))
    assert "-> learner_threads=1" in top.reasons[1]
    assert "1: 10,309, 2: 9,346" in top.reasons[1]


def test_a_learner_that_bounds_the_run_gets_both_cores_and_a_tie_keeps_one() -> None:
    # Cheap envs, a learner that halves its time on two threads. One thread: min(1/100us =
    # 10,000, 2/(10+5+100)us = 17,391) = 10,000; two: min(20,000, 2/(15+2x50)us) = 17,391.
    two = sizing.choose_topology(costs(10, 5, {1: 100, 2: 50}), cores=2, batch_size=32,
                                 central_inference=False)
    assert two.learner_threads == 2
    assert two.predicted_fps == pytest.approx(2 / (115 * US))
    # Ten times cheaper, the cores bound both: min(100,000, 2/25us) = 80,000 =
    # min(200,000, 2/(15+2x5)us): a tie keeps one thread for the actors.
    tied = sizing.choose_topology(costs(10, 5, {1: 10, 2: 5}), cores=2, batch_size=32,
                                  central_inference=False)
    assert tied.learner_threads == 1
    assert tied.predicted_fps == pytest.approx(80_000)


def test_a_second_learner_thread_must_promise_ten_percent() -> None:
    # The costs APPO's Pong run measured on 2 cores (env 88, forward 28 us; learner 344 us
    # on one thread, 264 on two): min(1/344us, 2/(88+28+344)us) = 2,907 frames/s on one,
    # min(1/264us, 2/(116+528)us) = 3,106 on two: 1.07x, under the 10% a thread must buy
    # (two threads beside another run made 315 frames/s, one thread 2,240).
    top = sizing.choose_topology(costs(88, 28, {1: 344, 2: 264}), cores=2, batch_size=8,
                                 central_inference=False)
    assert top.learner_threads == 1
    assert top.predicted_fps == pytest.approx(1 / (344 * US))
    assert "1: 2,907, 2: 3,106 -> learner_threads=1" in top.reasons[1]
    # a learner that bounds the run harder: 3,876 against 2,907 (1.33x) takes the second thread
    more = sizing.choose_topology(costs(88, 28, {1: 344, 2: 200}), cores=2, batch_size=8,
                                  central_inference=False)
    assert more.learner_threads == 2


def test_a_gpu_learner_leaves_the_cores_to_actors() -> None:
    # 16 cores, a GPU learner at 4 us per frame: min(250,000, 16/(83+25)us = 148,148);
    # actors need 148,148 x 108us = 16 cores -> 13 actors of (83+25)/83 = 1.30 cores each.
    top = sizing.choose_topology(costs(83, 25, {1: 4}), cores=16, batch_size=32,
                                 central_inference=False, gpu_learner=True)
    assert top.learner_threads == 1
    assert top.predicted_fps == pytest.approx(16 / (108 * US))
    assert top.actors == 13
    assert "1.30 each with 2 env groups -> actors=13" in top.reasons[2]


def test_an_actor_counts_the_cores_its_env_groups_overlap() -> None:
    # The H100 check's Pong costs (env 141, forward 23 us; 16 cores, GPU learner): an actor
    # keeps (141+23)/141 = 1.16 cores busy, so the 16 cores the actors need take 14 actors.
    # There the flat 2 cores per actor used before gave 8 actors, which kept 8.4 busy.
    assert sizing.cores_per_actor(costs(141, 23, {1: 1}), False) == pytest.approx(164 / 141)
    assert sizing.cores_per_actor(costs(20, 20, {1: 1}), False) == pytest.approx(2.0)
    assert sizing.cores_per_actor(costs(141, 23, {1: 1}), True) == 1.0  # SEED's env workers
    top = sizing.choose_topology(costs(141, 23, {1: 1}), cores=16, batch_size=32,
                                 central_inference=False, gpu_learner=True)
    assert top.actors == 14


def test_seed_env_workers_pay_only_for_the_env() -> None:
    # SEED: the learner process runs inference too: its bound is 1/(forward + learn).
    # 8 cores, env 83, forward 25, learner 20 us on 1 thread (only 1 measured: Amdahl has
    # nothing to go on, so more threads are not faster): min(1/45us = 22,222,
    # 8/(83+25+20)us = 62,500) = 22,222; the workers need 22,222 x 83us = 1.84 cores, one
    # core each (they only step envs): 2 workers.
    top = sizing.choose_topology(costs(83, 25, {1: 20}), cores=8, batch_size=32,
                                 central_inference=True)
    assert top.learner_threads == 1
    assert top.predicted_fps == pytest.approx(1 / (45 * US))
    assert top.actors == 2
    assert "env workers need 1.84 of 8 cores" in top.reasons[2]


def test_seed_on_a_gpu_sizes_by_the_gpus_forward_pass() -> None:
    # The H200 check's SEED-R2D2 Pong costs: env 144, CPU forward 61 (Nature CNN, one
    # thread), GPU learner 3 us; 16 cores. Sized by the CPU forward, the server's bound is
    # 1/(61+3)us = 15,625 frames/s and 15,625 x 144us = 2.25 cores of env workers: 3
    # workers, which kept 2.9 of 16 cores busy there. The forward runs on the GPU: at 10 us
    # a frame the bound is min(1/13us = 76,923, 16/144us = 111,111) (the cores pay only
    # for the envs) and the workers need 76,923 x 144us = 11.08 cores: 12.
    cpu_sized = sizing.choose_topology(costs(144, 61, {1: 3}), cores=16, batch_size=None,
                                       central_inference=True, gpu_learner=True)
    assert cpu_sized.actors == 3
    gpu = dataclasses.replace(costs(144, 61, {1: 3}), gpu_forward_s=10 * US)
    top = sizing.choose_topology(gpu, cores=16, batch_size=None, central_inference=True,
                                 gpu_learner=True)
    assert top.predicted_fps == pytest.approx(1 / (13 * US))
    assert top.actors == 12
    assert "forward 61 us (10 us on the learner's GPU, which runs it)" in top.reasons[0]
    # Actors with their own policy copies still pay the CPU forward themselves.
    impala = sizing.choose_topology(gpu, cores=16, batch_size=32, central_inference=False,
                                    gpu_learner=True)
    assert impala.predicted_fps == pytest.approx(16 / (205 * US))


def test_seed_leaves_the_inference_server_a_core_of_its_own() -> None:
    # SEED on 2 cores with costs measured on Pong (env 75, forward 17, learner 79 us on one
    # thread and 40 on two): without the rule two threads would rank first (min(1/57us,
    # 2/(75+17+80)us) = 11,628 against min(1/96us, 2/171us) = 10,417), but the server's
    # thread beside two OpenMP threads made that run 0.83x of one thread's; so only t=1 is
    # considered. On 4 cores up to 3.
    top = sizing.choose_topology(costs(75, 17, {1: 79, 2: 40}), cores=2, batch_size=32,
                                 central_inference=True)
    assert top.learner_threads == 1
    assert top.predicted_fps == pytest.approx(1 / (96 * US))
    assert "1: 10,417 (at most 1: the inference server's thread keeps a core)" in top.reasons[1]
    four = sizing.choose_topology(costs(75, 17, {1: 79, 4: 20}), cores=4, batch_size=32,
                                  central_inference=True)
    assert four.learner_threads == 3
    assert " 4: " not in four.reasons[1]
    # IMPALA (no server thread) may still take every core
    impala = sizing.choose_topology(costs(10, 5, {1: 100, 2: 50}), cores=2, batch_size=32,
                                    central_inference=False)
    assert impala.learner_threads == 2


def test_envs_per_group_divides_the_batch() -> None:
    assert sizing.envs_per_group(32) == 32
    assert sizing.envs_per_group(8) == 8
    assert sizing.envs_per_group(48) == 24
    assert sizing.envs_per_group(7) == 7
    assert sizing.envs_per_group(None) == 32


def test_learner_cost_between_measured_threads_follows_amdahl() -> None:
    # 100 us on 1 thread, 40 on 4: parallel fraction p = (1 - 0.4) / (1 - 1/4) = 0.8, so
    # 2 threads take 100 x (0.2 + 0.4) = 60 us and 8 take 100 x (0.2 + 0.1) = 30 us.
    c = costs(0, 0, {1: 100, 4: 40})
    assert c.learn_at(2) == pytest.approx(60 * US)
    assert c.learn_at(8) == pytest.approx(30 * US)
    assert c.learn_at(4) == pytest.approx(40 * US)
    assert costs(0, 0, {1: 100}).learn_at(4) == pytest.approx(100 * US)


def test_learner_passes_per_env_step() -> None:
    assert sizing.learner_passes(None) == 1.0  # IMPALA learns each step once
    # Ape-X at 4 samples per transition: a forward-and-backward and two forwards (a third
    # each) per sample.
    assert sizing.learner_passes(4.0, 1, 1, 2) == pytest.approx(4 * (1 + 2 / 3))
    # R2D2, 80 trained + 5 bootstrap steps, burn-in 40 + target over 125, period 40, 1
    # sample per sequence: (85 + 165/3) / 40.
    assert sizing.learner_passes(1.0, 40, 85, 165) == pytest.approx((85 + 55) / 40)
    assert sizing.learner_passes(0.0, 1, 1, 2) == pytest.approx(1 + 2 / 3)  # uncapped


def measure_pong(device: str, calls: list | None = None) -> sizing.Costs:
    """Pong's costs with IMPALA's shallow torso, 8 envs a group, timed briefly."""

    def make_model(obs_shape, num_actions):
        if calls is not None:
            calls.append((obs_shape, num_actions))
        model = torch.nn.Module()
        model.torso = ShallowCNN(obs_shape[0], obs_shape[1])
        return model

    return sizing.measure_costs(EnvConfig(id="Pong"), make_model, per_group=8,
                                learner_batch=64, learner_passes=1.0, max_threads=1,
                                device=torch.device(device), seconds=0.05)


def test_measured_costs_are_per_frame(monkeypatch) -> None:
    """Each timed call's seconds become seconds per env frame: a step of 8 Pong envs is
    32 frames, a forward serves the same 8 observations, and the learner's pass over 64
    observations, once per env step (4 frames), costs 1/64/4 of its time per frame. The
    timer is stood in for (2, 3 and 5 s per call, in the order measure_costs times them),
    so the arithmetic is checked, not the machine's speed."""
    per_call = iter([2.0, 3.0, 5.0])
    monkeypatch.setattr(sizing, "_time", lambda fn, seconds, sync: next(per_call))
    calls: list = []
    measured = measure_pong("cpu", calls)
    assert calls[0] == ((4, 84, 84), 6)
    assert measured.env_s == 2.0 / 32
    assert measured.forward_s == 3.0 / 32
    assert measured.learn_s == {1: 5.0 / 64 * 1.0 / 4}
    # a CPU learner runs SEED's inference at the actors' cost: nothing timed on a GPU
    assert measured.gpu_forward_s is None
    assert measured.inference_s == measured.forward_s


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_learner_pass_is_timed_in_the_runs_precision(precision) -> None:
    """With agent.precision=bfloat16 the learner's forward runs under autocast while it is
    timed (and the actors' forward never does)."""
    seen: list[tuple[bool, bool]] = []

    class Probe(ShallowCNN):
        def forward(self, x):
            seen.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")))
            return super().forward(x)

    def make_model(obs_shape, num_actions):
        model = torch.nn.Module()
        model.torso = Probe(obs_shape[0], obs_shape[1])
        return model

    sizing.measure_costs(EnvConfig(id="Pong"), make_model, per_group=8, learner_batch=16,
                         learner_passes=1.0, max_threads=1, device=torch.device("cpu"),
                         seconds=0.01, precision=precision)
    learner = {autocast for grad, autocast in seen if grad}
    actors = {autocast for grad, autocast in seen if not grad}
    assert learner == {precision == "bfloat16"} and actors == {False}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_learner_times_seed_inference_on_the_gpu(monkeypatch) -> None:
    """A GPU learner also times the forward of one group's batch on the GPU (the third
    timed call, 7 s here), per frame, and SEED's inference is charged at that cost."""
    per_call = iter([2.0, 3.0, 7.0, 5.0])
    monkeypatch.setattr(sizing, "_time", lambda fn, seconds, sync: next(per_call))
    measured = measure_pong("cuda")
    assert measured.gpu_forward_s == 7.0 / 32
    assert measured.inference_s == measured.gpu_forward_s
    assert measured.learn_s == {1: 5.0 / 64 / 4}


def settings_with(dist: DistributedConfig, env_id: str = "CartPole-v1") -> RunSettings:
    config_text = ("distributed:\n  actors: auto\n  envs_per_actor: auto\n"
                   "  env_groups: auto\n  learner_threads: auto\n")
    return RunSettings(env=EnvConfig(id=env_id), distributed=dist, log=LogConfig(),
                       checkpoint=CheckpointConfig(), seed=0, total_frames=1000,
                       config_text=config_text)


def no_model(obs_shape, num_actions):
    raise AssertionError("nothing is measured here")


def test_auto_off_atari_keeps_the_hand_set_topology() -> None:
    lines: list[str] = []
    resolved = sizing.resolve(settings_with(DistributedConfig()), no_model, batch_size=32,
                              learner_batch=640, passes=1.0, central_inference=False,
                              device=torch.device("cpu"), announce=lines.append)
    dist = resolved.distributed
    assert (dist.actors, dist.envs_per_actor, dist.env_groups, dist.learner_threads) == (
        2, 32, 2, 0)
    assert "measured sizing is for Atari games" in lines[1]


def test_auto_on_atari_uses_the_measurement_keeps_given_numbers_and_records_the_choice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake_measure(env_cfg, make_model, per_group, learner_batch, passes, max_threads,
                     device, precision):
        seen.update(per_group=per_group, learner_batch=learner_batch, passes=passes,
                    precision=precision)
        return costs(83, 25, {1: 86, 2: 53})

    monkeypatch.setattr(sizing, "measure_costs", fake_measure)
    monkeypatch.setattr(sizing, "machine_cores", lambda: 2)
    given = DistributedConfig(env_groups=4)  # a number given stays
    lines: list[str] = []
    resolved = sizing.resolve(settings_with(given, "Pong"), no_model, batch_size=32,
                              learner_batch=5000, passes=1.0, central_inference=False,
                              device=torch.device("cpu"), announce=lines.append)
    dist = resolved.distributed
    assert (dist.actors, dist.envs_per_actor, dist.env_groups, dist.learner_threads) == (
        1, 64, 4, 1)
    assert seen == {"per_group": 32, "learner_batch": sizing.LEARNER_BATCH, "passes": 1.0,
                    "precision": "float32"}
    assert lines[0] == ("[distrl] auto sizing on 2 cores: distributed.actors=1 "
                        "distributed.envs_per_actor=64 distributed.learner_threads=1")
    assert "actors: 1\n" in resolved.config_text
    assert "learner_threads: 1\n" in resolved.config_text
    assert "env_groups: auto\n" in resolved.config_text  # not chosen here: not rewritten


def test_nothing_auto_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizing, "measure_costs", no_model)
    settings = settings_with(DistributedConfig(actors=1, envs_per_actor=8, env_groups=2,
                                               learner_threads=2), "Pong")
    resolved = sizing.resolve(settings, no_model, batch_size=8, learner_batch=640,
                              passes=1.0, central_inference=False,
                              device=torch.device("cpu"), announce=print)
    assert resolved is settings


def test_under_torchrun_every_rank_sizes_by_the_reference_costs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizing, "measure_costs", no_model)
    monkeypatch.setattr(sizing, "machine_cores", lambda: 2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    lines: list[str] = []
    resolved = sizing.resolve(settings_with(DistributedConfig(), "Pong"), no_model,
                              batch_size=32, learner_batch=640, passes=1.0,
                              central_inference=False, device=torch.device("cpu"),
                              announce=lines.append)
    assert dataclasses.astuple(resolved.distributed)[:5] == (1, 64, 2, 1, 1)
    assert "reference costs: not measured under torchrun" in lines[1]


@pytest.mark.parametrize("field,value,message", [
    ("actors", "many", "distributed.actors must be auto or a whole number >= 0, got 'many'"),
    ("envs_per_actor", 0, "distributed.envs_per_actor must be auto or a whole number >= 1"),
    ("learner_threads", -1, "distributed.learner_threads must be auto or a whole number >= 0"),
    ("env_groups", 1.5, "distributed.env_groups must be auto or a whole number >= 1"),
])
def test_bad_sizes_are_refused_by_name(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DistributedConfig(**{field: value})


def test_seed_sources_are_known_to_run_inference_on_the_learner() -> None:
    import functools

    from distrl.runners.seed_sources import SeedReplaySource, SeedSource
    from distrl.runners.unroll_sources import UnrollActorSource

    assert sizing.runs_inference(functools.partial(SeedSource, max_batch=4))
    assert sizing.runs_inference(SeedReplaySource)
    assert not sizing.runs_inference(UnrollActorSource)
