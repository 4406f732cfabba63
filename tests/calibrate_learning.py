"""Run the learning tests on calibration seeds and collect what each judges.

    python tests/calibrate_learning.py [--seeds 100 101] [-k EXPRESSION] [--out FILE]

For each seed, runs ``pytest -m slow`` (or the tests ``-k`` selects) with
``DISTRL_LEARNING_SEED`` set, and appends every ``LEARNING ...`` line the tests print to
``--out`` (default ``tests/learning_calibration.txt``) with the date; pytest's whole
output goes to ``--log`` (default ``calibrate_learning.log``), for a test that fails
before its line. The thresholds in
the learning tests' docstrings come from these lines; a test that fails on a calibration
seed still prints its line first.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
from pathlib import Path

from learning import CALIBRATION_SEEDS, SEED_VARIABLE

TESTS = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(CALIBRATION_SEEDS))
    parser.add_argument("-k", default=None, help="pytest -k expression")
    parser.add_argument("--out", type=Path, default=TESTS / "learning_calibration.txt")
    parser.add_argument("--log", type=Path, default=Path("calibrate_learning.log"))
    args = parser.parse_args()
    for seed in args.seeds:
        command = [sys.executable, "-m", "pytest", "-m", "slow", "-s", "-q", "-p",
                   "no:cacheprovider", str(TESTS)] + (["-k", args.k] if args.k else [])
        env = {**os.environ, SEED_VARIABLE: str(seed)}
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=TESTS.parent)
        assert proc.stdout is not None
        for line in proc.stdout:
            with open(args.log, "a") as log:
                log.write(line)
            if "LEARNING " in line:  # after pytest's progress dots, when -q prints them
                stamped = f"{datetime.date.today()} {line[line.index('LEARNING '):].strip()}"
                print(stamped, flush=True)
                with open(args.out, "a") as out:
                    out.write(stamped + "\n")
        proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
