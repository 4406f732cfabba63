"""``python run.py`` command lines run one after another in one process, each through
run.py's own entry point: its hook that makes Hydra's errors one line, ``@hydra.main``
and the exit code. For the tests' many bad-input cases, each of which would spend seconds
importing in a process of its own.

Reads one JSON list of arguments per line on stdin; writes, for each, one JSON object
(``code``, ``stdout``, ``stderr``) per line on the stdout it started with. Ends at the
end of stdin.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra.core.global_hydra import GlobalHydra  # noqa: E402

import run  # noqa: E402


def exit_code(stop: SystemExit) -> int:
    """The exit status ``sys.exit(stop.code)`` gives a process."""
    if stop.code is None:
        return 0
    return stop.code if isinstance(stop.code, int) else 1


def run_one(arguments: list[str]) -> dict[str, object]:
    """``python run.py <arguments>``: its exit code and what it printed."""
    GlobalHydra.instance().clear()  # a case that failed inside Hydra may leave it set
    sys.argv = [run.__file__, *arguments]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            run.main()
            code = 0
        except SystemExit as stop:
            code = exit_code(stop)
        except BaseException:  # as the interpreter reports an uncaught exception
            traceback.print_exc()
            code = 1
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> None:
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    # Hydra looks for config_path next to the task's file only when its module is
    # __main__ (as under ``python run.py``); imported, run.py would be looked up as a package.
    run.main.__wrapped__.__module__ = "__main__"
    run.report_command_line_errors_in_one_line()
    for line in sys.stdin:
        replies.write(json.dumps(run_one(json.loads(line))) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
