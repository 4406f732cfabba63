#!/usr/bin/env bash
# The GPU check, one script: build distrl._C with its CUDA kernels, run the tests marked
# gpu, time the kernels (benchmarks/kernels.py) and each agent's throughput with the
# learner on the GPU (benchmarks/fps.py agent.device=cuda, Pong).
#
#     OUT=gpu-check bash benchmarks/gpu_check.sh [STEP ...]
#
# Steps (ALL_STEPS below): build, tests, kernels, fps-impala, fps-apex, fps-r2d2, fps-seed,
# fps-seed-r2d2; with none named it runs them all, in that order; a failed build stops it.
# Not in ALL_STEPS, named when wanted: runs, a real run of RUN_SECONDS (default 120) of
# each agent's Atari preset on Pong (RUN_PRESETS) with the learner on DEVICE (default
# cuda), its tensorboard events copied to $OUT/runs/<preset>/ and its diagnosis printed
# (python -m distrl.diagnose): figures of a run, where the fps steps time a window; and
# grid, runs of a results grid (GRID_GAMES, GRID_SEEDS, ...: see the step) through the
# suite harness into its archive, each run's archive directory returned as a tarball.
# Each step has its own time limit, writes its whole output to $OUT/<step>.log and prints the tail,
# so one hung step cannot eat the others. Wheels in .whl/ (packages the GPU machine
# lacks: gymnasium, ale-py, hydra-core, ...) are installed first when that folder exists.
set -u
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python3}
ALL_STEPS=(build tests kernels fps-impala fps-apex fps-r2d2 fps-seed fps-seed-r2d2)
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=("${ALL_STEPS[@]}")

run_step() {  # run_step NAME SECONDS COMMAND...: output to $OUT/NAME.log, tail printed
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    echo "=== $name: $* ($(date +%T), limit ${limit}s)" | tee -a "$OUT/$name.log"
    timeout -k 10 "$limit" "$@" >> "$OUT/$name.log" 2>&1
    rc=$?
    echo "=== $name: rc=$rc after $((SECONDS - start)) s"
    tail -n "${TAIL:-20}" "$OUT/$name.log"
    return $rc
}

if [ -d .whl ]; then
    [ -d /tmp/site/gymnasium ] || "$PY" -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name(0)); import os; print('cores', len(os.sched_getaffinity(0)))"

for step in "${STEPS[@]}"; do
    case $step in
    build)
        # Hopper only (sm_90): one architecture compiles in a fraction of the time.
        # CC/CXX pick the host compiler (torch passes CC to nvcc as -ccbin). In session 27
        # the image's CC=/opt/gcc/bin/gcc built an extension whose error messages crashed
        # (SIGSEGV streaming an int64 into a TORCH_CHECK message, on CPU and CUDA alike);
        # in session 30 the system g++ 13.3 built one that passed every op test on both
        # devices, so the system compilers are the default (KEEP_CC=1 keeps the image's).
        # The lines below record which compilers built it and whether libstdc++'s stream
        # code was copied into _C.
        if [ -z "${KEEP_CC:-}" ] && [ -x /usr/bin/g++ ]; then
            export CC=/usr/bin/gcc CXX=/usr/bin/g++
        fi
        echo "CC=${CC:-unset} CXX=${CXX:-unset}; $(${CXX:-c++} --version | head -1);" \
            "system g++: $(/usr/bin/g++ --version 2>/dev/null | head -1)" | tee -a "$OUT/build.log"
        TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=16 \
            run_step build 300 "$PY" setup.py build_ext --inplace || exit 1
        echo "libstdc++ stream symbols defined in _C: $(nm -C --defined-only distrl/_C*.so \
            | grep -c 'std::basic_ostream')" | tee -a "$OUT/build.log"
        "$PY" -c "from distrl import ops; import torch
print('extension:', ops.has_extension(), ops.extension_error())
print({op: ops.has_kernel(op, 'cuda') for op in ops.OPS})" | tee -a "$OUT/build.log"
        ;;
    tests)
        # Every test of the compiled ops on both devices first (quick; the CPU kernels'
        # error messages too: they share the build's toolchain), then the tests marked gpu.
        run_step tests 120 "$PY" -m pytest -q -p no:cacheprovider -n 8 --timeout 100 \
            tests/test_ops.py tests/test_sum_tree.py
        run_step tests "${TESTS_LIMIT:-300}" "$PY" -m pytest -m gpu -q -p no:cacheprovider \
            -n 8 --timeout 240 tests
        ;;
    kernels)
        run_step kernels 150 "$PY" benchmarks/kernels.py --json "$OUT/kernels.json"
        ;;
    fps-impala)  # REPEATS (default 3) sets --repeats of the fps steps
        run_step fps 120 "$PY" benchmarks/fps.py agent=impala env=Pong agent.device=cuda \
            --repeats "${REPEATS:-3}" --updates 30
        ;;
    fps-apex)
        run_step fps 130 "$PY" benchmarks/fps.py agent=apex env=Pong agent.device=cuda \
            --repeats "${REPEATS:-3}" --warmup-updates 3 --updates 20
        ;;
    fps-r2d2)
        run_step fps 130 "$PY" benchmarks/fps.py agent=r2d2 env=Pong agent.device=cuda \
            agent.learning_starts=64 --repeats "${REPEATS:-3}" --warmup-updates 2 --updates 10
        ;;
    fps-seed)  # SEED-IMPALA, alternating with its IMPALA twin in each repeat
        run_step fps 200 "$PY" benchmarks/fps.py agent=seed env=Pong agent.device=cuda \
            --repeats "${REPEATS:-3}" --updates 30
        ;;
    fps-seed-r2d2)  # SEED-R2D2, alternating with its R2D2 twin in each repeat
        run_step fps 200 "$PY" benchmarks/fps.py agent=seed agent.learner=r2d2 env=Pong \
            agent.device=cuda agent.r2d2.learning_starts=64 --repeats "${REPEATS:-3}" \
            --warmup-updates 2 --updates 10
        ;;
    runs)  # RUN_PRESETS: which presets (default: every agent's Atari preset)
        for preset in ${RUN_PRESETS:-atari_short_appo atari_short_apex atari_short_r2d2 \
                atari_short_seed_appo atari_short_seed_r2d2}; do
            rm -rf "/tmp/gpu-runs/$preset"
            # SIGTERM at RUN_SECONDS: the run checkpoints and exits 143, as a stopped run does
            run_step "run-$preset" $((${RUN_SECONDS:-120} + 90)) timeout -s TERM -k 60 \
                "${RUN_SECONDS:-120}" "$PY" run.py +experiment="$preset" env=Pong \
                agent.device="${DEVICE:-cuda}" eval.episodes=0 log.progress=lines \
                log.dir=/tmp/gpu-runs log.name="$preset"
            mkdir -p "$OUT/runs/$preset"
            cp /tmp/gpu-runs/"$preset"/events.out.* "$OUT/runs/$preset/"
            run_step "run-$preset" 60 "$PY" -m distrl.diagnose "/tmp/gpu-runs/$preset"
        done
        ;;
    grid)  # runs of a results grid on this machine's cores, into the committed archive
        # GRID_GAMES (required), GRID_SEEDS (0), GRID_AGENT (appo), GRID_FRAMES (10000000),
        # GRID_ARCHIVE (results/atari/atari5_appo), GRID_JOBS (1: runs side by side; each
        # sizes itself for every core, so give each its share with GRID_SET, e.g.
        # distributed.actors=6), GRID_SET (more overrides for every run),
        # GRID_MINUTES (8, whole minutes): the harness stops and
        # carries what has not finished by then. Each run's archive directory (a finished
        # run's record, or a stopped run's carry) comes back as $OUT/grid-<run>.tgz; unpack
        # it into the same archive where the grid is kept: tar xzf grid-<run>.tgz -C <archive>
        archive=${GRID_ARCHIVE:-results/atari/atari5_appo}
        run_step grid $((${GRID_MINUTES:-8} * 60 + 150)) "$PY" benchmarks/reproduce.py \
            --suite atari --out /tmp/gpu-grid --archive "$archive" --agents "${GRID_AGENT:-appo}" \
            --games ${GRID_GAMES:?GRID_GAMES names the games} --seeds ${GRID_SEEDS:-0} \
            --frames "${GRID_FRAMES:-10000000}" --stop-after "${GRID_MINUTES:-8}" \
            --jobs "${GRID_JOBS:-1}" \
            --set log.progress=lines agent.device="${DEVICE:-cuda}" ${GRID_SET:-}
        for game in $GRID_GAMES; do
            for seed in ${GRID_SEEDS:-0}; do
                run="${GRID_AGENT:-appo}-$game-s$seed"
                [ -d "$archive/$run" ] && tar czf "$OUT/grid-$run.tgz" -C "$archive" "$run"
            done
        done
        ;;
    *)
        echo "gpu_check: unknown step $step (allowed: ${ALL_STEPS[*]} runs grid)" >&2
        exit 2
        ;;
    esac
done
