"""The commands and the Python code in the documentation work as written.

The pages checked are README.md and every page under docs/ except docs/notes/, whose dated
notes record commands as they were run then. Only fenced code blocks are read; a block
just after ``<!-- doc-test: skip (reason) -->`` is not checked, and its cases report the
reason as skipped.

- Every ``python run.py ...`` command (also after ``torchrun ... run.py``, and the
  overrides given to ``examples/slurm/distrl.sbatch``, which passes them on to run.py; and
  those of ``benchmarks/fps.py``, which composes run.py's config from them) composes and
  validates as the command line would: Hydra's compose API, then ``OmegaConf.to_object``,
  which validates every field through the typed dataclasses; an error is worded by run.py's
  own ``format_error``. In process, and each distinct override list once, since a
  subprocess per command would spend seconds importing. Read as the shell reads it (shlex:
  quotes, ``\\`` continued lines, ``&&``, comments), then as run.py reads it: ``-m`` is
  dropped and a sweep ``a=1,2,3`` takes its first value; ``hydra.*`` and ``hydra/...``
  overrides compose with the rest (without the launcher plugin they name installed, the
  launcher's overrides are dropped); ``resume=`` is dropped (it needs a run directory) and
  the rest checked. A shell variable (``$SLURM_JOB_ID``, ``"${X}"``) becomes ``1``; a
  ``${seed}`` in single quotes is Hydra's interpolation and stays. A placeholder in angle
  brackets (``<run name>``) goes with a ``resume=`` override; anywhere else the command is
  skipped with its reason, as no value can stand for every placeholder.
- In a console transcript (lines starting ``$ ``) a command whose output starts
  ``distrl: error:`` must fail with exactly that line.
- Every ``python benchmarks/<script>.py`` and ``python -m distrl.<module>`` answers
  ``--help`` with exit 0, once per script; every file under benchmarks/ or examples/ that a
  command names exists.
- Every ``python`` block runs as a reader who saves it to a file runs it: ``python
  <file>.py`` in a temporary directory (so a block that starts processes needs its
  ``if __name__ == "__main__":`` guard, as they import the file again); tracebacks name the
  page's lines. Identical blocks run once.

The subprocesses (``--help``, the blocks) all start together with the module's first test
and run while the commands compose in this process.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

import agents
from distrl.config import ConfigError, register_configs

REPO = Path(__file__).resolve().parents[1]
EXCLUDED = ("docs/notes/",)  # dated notes: commands as they were run then
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console", "shell-session", "zsh"}
PYTHON_LANGUAGES = {"python", "py"}
SKIP_MARKER = re.compile(r"<!--\s*doc-test:\s*skip\s*\((?P<reason>.+)\)\s*-->")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
PLACEHOLDER = "__PLACEHOLDER__"
ANGLE_PLACEHOLDER = re.compile(r"<[A-Za-z][^<>\n]*>")
SHELL_VARIABLE = re.compile(r"\$(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*|\([^)]*\))")
SHELL_VALUE = "1"  # what a shell variable stands for: parses as an int, a float, a name, a path
OPERATORS = {"&&", "||", ";", "|", "&", "(", ")"}
REDIRECTIONS = {">", ">>", "<", ">&", "&>"}
PYTHON = re.compile(r"^(.*/)?python(3(\.\d+)?)?$")
# Scripts that pass their arguments on to run.py, and scripts that compose run.py's config
# from the key=value arguments among their own options.
RUN_PY_WRAPPERS = ("examples/slurm/distrl.sbatch",)
RUN_PY_OVERRIDE_SCRIPTS = ("benchmarks/fps.py",)
CHECKED_FILES = re.compile(r"^(benchmarks|examples)/\S+\.\w+$")
# hydra/launcher=<name> and the plugin package that provides it
LAUNCHER_PLUGINS = {"joblib": "hydra_plugins.hydra_joblib_launcher",
                    "submitit_local": "hydra_plugins.hydra_submitit_launcher",
                    "submitit_slurm": "hydra_plugins.hydra_submitit_launcher"}
HELP_TIMEOUT_S = 120
BLOCK_TIMEOUT_S = 240


def doc_pages() -> list[Path]:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [page for page in pages
            if not page.relative_to(REPO).as_posix().startswith(EXCLUDED)]


@dataclass(frozen=True)
class Block:
    """A fenced code block: its page, the line of its first content line, its language."""

    page: str
    line: int
    lang: str
    lines: tuple[str, ...]
    skip: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def fenced_blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence = opening["fence"]
        previous = next((line for line in reversed(lines[:i]) if line.strip()), "")
        marker = SKIP_MARKER.search(previous)
        end = i + 1
        while end < len(lines) and not (
                lines[end].strip().startswith(fence[0] * len(fence))
                and not lines[end].strip().strip(fence[0])):
            end += 1
        indent = len(opening["indent"])
        content = tuple(line[indent:] if line[:indent].isspace() else line
                        for line in lines[i + 1:end])
        blocks.append(Block(page.relative_to(REPO).as_posix(), i + 2, opening["lang"].lower(),
                            content, marker["reason"] if marker else None))
        i = end + 1
    return blocks


def shell_lines(block: Block) -> Iterator[tuple[int, str, str | None]]:
    """Each command of a shell block with its line, continued lines joined; in a console
    transcript (lines starting ``$ ``), only the prompted lines, each with the first line of
    its output."""
    lines = block.lines
    transcript = any(line.startswith("$ ") for line in lines)
    i = 0
    while i < len(lines):
        line, number = lines[i], block.line + i
        i += 1
        if transcript:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        parts = [line]
        while parts[-1].rstrip().endswith("\\") and i < len(lines):
            parts[-1] = parts[-1].rstrip()[:-1]
            parts.append(lines[i])
            i += 1
        output = (lines[i] if transcript and i < len(lines) and not lines[i].startswith("$ ")
                  else None)
        yield number, " ".join(parts), output


def shell_words(text: str) -> list[list[str]]:
    """The simple commands of a command line, each as the shell's words: comments cut,
    shell variables outside single quotes replaced by ``1``, placeholders in angle
    brackets by a marker, redirections dropped. Raises ValueError on unbalanced quotes."""
    text = ANGLE_PLACEHOLDER.sub(PLACEHOLDER, text)
    out, quote, i = [], "", 0
    while i < len(text):
        char = text[i]
        if quote != "'" and char == "\\" and i + 1 < len(text):
            out.append(text[i:i + 2])
            i += 2
            continue
        if char in "'\"" and quote in ("", char):
            quote = "" if quote else char
        elif not quote and char == "#" and (i == 0 or text[i - 1].isspace()):
            break
        elif quote != "'" and char == "$":
            variable = SHELL_VARIABLE.match(text, i)
            if variable:
                out.append(SHELL_VALUE)
                i = variable.end()
                continue
        out.append(char)
        i += 1
    lexer = shlex.shlex("".join(out), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    commands: list[list[str]] = [[]]
    words = iter(list(lexer))
    for word in words:
        if word in OPERATORS:
            commands.append([])
        elif word in REDIRECTIONS:
            next(words, None)
        else:
            commands[-1].append(word)
    return [command for command in commands if command]


@dataclass(frozen=True)
class RunCommand:
    """The run.py overrides of one documented command."""

    where: str
    text: str
    overrides: tuple[str, ...]
    expected_error: str | None = None
    skip: str | None = None


@dataclass
class Found:
    run_commands: list[RunCommand] = field(default_factory=list)
    scripts: dict[str, str] = field(default_factory=dict)  # script or -m module -> where
    files: dict[str, str] = field(default_factory=dict)  # path -> where
    python_blocks: list[Block] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)


def without_assignments(words: list[str]) -> list[str]:
    i = 0
    while i < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]):
        i += 1
    return words[i:]


def read_command(words: list[str], where: str, text: str, output: str | None,
                 skip: str | None, found: Found) -> None:
    words = without_assignments(words)
    if not words:
        return
    expected = output.strip() if output and output.startswith("distrl: error:") else None
    for word in words:
        if CHECKED_FILES.match(word):
            found.files.setdefault(word, where)
    overrides: list[str] | None = None
    for j, word in enumerate(words):
        if word in ("run.py", "./run.py") or word in RUN_PY_WRAPPERS:
            overrides = words[j + 1:]
            break
    if PYTHON.match(words[0]) and len(words) > 1:
        if words[1] == "-m" and len(words) > 2 and words[2].startswith("distrl."):
            found.scripts.setdefault(f"-m {words[2]}", where)
        elif words[1].startswith("benchmarks/") and words[1].endswith(".py"):
            found.scripts.setdefault(words[1], where)
            if words[1] in RUN_PY_OVERRIDE_SCRIPTS:
                overrides = [word for word in words[2:]
                             if "=" in word and not word.startswith("-")]
    if overrides is None:
        return
    ids = {command.where for command in found.run_commands}
    unique, n = where, 2
    while unique in ids:
        unique, n = f"{where}#{n}", n + 1
    found.run_commands.append(RunCommand(unique, text, tuple(overrides), expected, skip))


@functools.cache
def found_in_docs() -> Found:
    found = Found()
    for page in doc_pages():
        for block in fenced_blocks(page):
            if block.lang in PYTHON_LANGUAGES:
                found.python_blocks.append(block)
                continue
            if block.lang not in SHELL_LANGUAGES:
                continue
            for number, text, output in shell_lines(block):
                if not re.search(r"run\.py|\.sbatch|benchmarks/|examples/|distrl\.", text):
                    continue
                where = f"{block.page}:{number}"
                try:
                    commands = shell_words(text)
                except ValueError as error:
                    found.unreadable.append(f"{where}: {text.strip()}: {error}")
                    continue
                for words in commands:
                    read_command(words, where, text.strip(), output, block.skip, found)
    return found


FOUND = found_in_docs()


# -- run.py's overrides ----------------------------------------------------------------

def _load_run_py() -> Any:
    spec = importlib.util.spec_from_file_location("distrl_run_py", REPO / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def run_py() -> Any:
    return _load_run_py()


def launcher_missing(overrides: list[Any]) -> str | None:
    """The launcher that ``hydra/launcher=<name>`` picks when its plugin is not installed."""
    for override in overrides:
        if override.key_or_group == "hydra/launcher":
            name = override.value()
            plugin = LAUNCHER_PLUGINS.get(name) if isinstance(name, str) else None
            if plugin and importlib.util.find_spec(plugin) is None:
                return name
    return None


def as_composed(words: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The overrides that compose as run.py's command line, and those left out.

    ``-m`` goes (a sweep's first value stands for it), as do ``resume=`` (it needs a run
    directory) with the ``resume_overrides=`` beside it (they apply only on a resume) and,
    when its plugin is missing, a launcher's overrides. Raises Hydra's
    OverrideParseException on an override run.py would not parse either."""
    kept, left_out = [], []
    for word in words:
        if word in ("-m", "--multirun"):
            left_out.append(word)
        elif word.startswith("-"):
            raise AssertionError(f"run.py flag {word!r}: this test knows only -m/--multirun")
        else:
            kept.append(word)
    parsed = OverridesParser.create().parse_overrides(kept)
    missing_launcher = launcher_missing(parsed)
    resuming = {"resume", "resume_overrides"} if any(
        o.key_or_group == "resume" for o in parsed) else set()
    overrides = []
    for word, override in zip(kept, parsed, strict=True):
        key = override.key_or_group
        if key in resuming or (missing_launcher and key.startswith(("hydra/launcher",
                                                                        "hydra.launcher"))):
            left_out.append(word)
        elif override.is_sweep_override():
            first = next(iter(override.sweep_string_iterator()))
            overrides.append(f"{override.get_key_element()}={first}")
        else:
            overrides.append(word)
    return overrides, left_out


@functools.cache
def composing_error(words: tuple[str, ...]) -> tuple[str | None, tuple[str, ...]]:
    """run.py's one-line error for these command-line words (None when they compose and
    validate), and the words left out of the check."""
    register_configs()
    agents.register_configs()
    left_out: list[str] = []
    try:
        overrides, left_out = as_composed(words)
        with initialize_config_dir(str(REPO / "experiments"), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException, ConfigError) as error:
        return run_py().format_error(error), tuple(left_out)
    return None, tuple(left_out)


@pytest.mark.parametrize("command", FOUND.run_commands, ids=lambda c: c.where)
def test_a_documented_run_py_command_composes(command: RunCommand) -> None:
    if command.skip:
        pytest.skip(f"{command.where}: doc-test: skip ({command.skip})")
    placeholders = [w for w in command.overrides if PLACEHOLDER in w
                    and not re.match(r"^\+*resume=", w)]
    if placeholders:
        pytest.skip(f"{command.where}: `{command.text}` has a placeholder in angle "
                    "brackets outside resume=, which no one value can stand for")
    error, _ = composing_error(command.overrides)
    if command.expected_error:
        assert error == command.expected_error, (
            f"{command.where}: `{command.text}` shows the error\n  {command.expected_error}\n"
            f"but run.py says\n  {error or '(nothing: the command is valid)'}")
    else:
        assert error is None, f"{command.where}: `{command.text}`\n  {error}"


# -- scripts and python blocks: subprocesses, all started at once ----------------------

def python_cases() -> list[tuple[str, Block]]:
    """Each distinct block once, named by where it is (and where its copies are)."""
    by_code: dict[str, list[Block]] = {}
    for block in FOUND.python_blocks:
        by_code.setdefault("\n".join(block.lines), []).append(block)
    return [(" = ".join(b.where for b in blocks), blocks[0]) for blocks in by_code.values()]


PYTHON_CASES = python_cases()


def as_script(block: Block) -> str:
    """The block as a file, blank lines first so that a traceback's line numbers are the
    page's."""
    return "\n" * (block.line - 1) + "\n".join(block.lines) + "\n"


@pytest.fixture(scope="module", autouse=True)
def started(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[object, subprocess.Popen[str]]]:
    """The subprocesses of the selected script and block cases, all started at once (they
    spend most of their time importing torch); any still running at the end is ended."""
    wanted = {item.callspec.params.get("script") or item.callspec.params.get("block")
              for item in request.session.items
              if item.path == Path(__file__) and hasattr(item, "callspec")}
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    runs: dict[object, subprocess.Popen[str]] = {}
    for script in FOUND.scripts:
        if script in wanted and (script.startswith("-m ") or (REPO / script).is_file()):
            runs[script] = subprocess.Popen(
                [sys.executable, *script.split(), "--help"], cwd=REPO, env=environment,
                text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True)
    for _, block in PYTHON_CASES:
        if block in wanted and not block.skip:
            workdir = tmp_path_factory.mktemp("doc_block")
            path = workdir / f"{Path(block.page).stem}_{block.line}.py"
            path.write_text(as_script(block))
            runs[block] = subprocess.Popen(
                [sys.executable, str(path)], cwd=workdir, env=environment, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    yield runs
    for proc in runs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def finished(proc: subprocess.Popen[str], timeout: float) -> str:
    """What ``proc`` printed, once it has ended; its process group is killed at the timeout."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"still running after {timeout} s:\n{out[-3000:]}", pytrace=False)
    return out


@pytest.mark.parametrize("script", sorted(FOUND.scripts))
def test_a_documented_script_answers_help(
        script: str, started: dict[object, subprocess.Popen[str]]) -> None:
    where = FOUND.scripts[script]
    if not script.startswith("-m "):
        assert (REPO / script).is_file(), f"{where}: {script} does not exist"
    proc = started[script]
    out = finished(proc, HELP_TIMEOUT_S)
    assert proc.returncode == 0, (
        f"{where}: python {script} --help exited {proc.returncode}:\n{out[-3000:]}")
    assert "usage" in out.lower(), f"{where}: python {script} --help printed no usage"


@pytest.mark.parametrize("block", [block for _, block in PYTHON_CASES],
                         ids=[name for name, _ in PYTHON_CASES])
def test_a_documented_python_block_runs(
        block: Block, started: dict[object, subprocess.Popen[str]]) -> None:
    if block.skip:
        pytest.skip(f"{block.where}: doc-test: skip ({block.skip})")
    proc = started[block]
    out = finished(proc, BLOCK_TIMEOUT_S)
    assert proc.returncode == 0, (
        f"{block.where}: the block, saved as a file and run with python, exited "
        f"{proc.returncode} (line numbers are the page's):\n{out[-5000:]}")


def test_the_files_commands_name_exist() -> None:
    missing = [f"{where}: {path}" for path, where in FOUND.files.items()
               if not (REPO / path).is_file()]
    assert not missing, "documented commands name files that do not exist:\n" + "\n".join(
        missing)


def test_every_command_reads_as_the_shell_reads_it() -> None:
    assert not FOUND.unreadable, "\n".join(FOUND.unreadable)


# -- the checks find what they check ---------------------------------------------------

def test_the_checks_find_the_documented_commands() -> None:
    """A reader that found nothing would pass everything."""
    assert len(FOUND.run_commands) >= 30, [c.where for c in FOUND.run_commands]
    assert {"benchmarks/reproduce.py", "benchmarks/fps.py", "-m distrl.diagnose"} <= set(
        FOUND.scripts), FOUND.scripts
    assert len(FOUND.python_blocks) >= 4
    assert any("torchrun" in c.text for c in FOUND.run_commands)
    assert any("distrl.sbatch" in c.text for c in FOUND.run_commands)
    assert any(c.expected_error for c in FOUND.run_commands)
    for wrapper in RUN_PY_WRAPPERS:  # it passes its arguments on to run.py
        assert re.search(r'run\.py .*"\$@"', (REPO / wrapper).read_text()), wrapper


def test_a_command_reads_as_the_shell_and_run_py_read_it() -> None:
    line = ("A=$HOME python run.py -m seed=0,1,2 'log.name=s${seed}' \"log.dir=/x/$USER\" \\\n"
            "  resume=runs/<run name> hydra.launcher.n_jobs=2  # a comment's 'quote")
    (words,) = shell_words(line.replace("\\\n", " "))
    assert words == ["A=1", "python", "run.py", "-m", "seed=0,1,2", "log.name=s${seed}",
                     "log.dir=/x/1", f"resume=runs/{PLACEHOLDER}", "hydra.launcher.n_jobs=2"]
    overrides, left_out = as_composed(tuple(words[3:]))
    assert overrides == ["seed=0", "log.name=s${seed}", "log.dir=/x/1",
                         "hydra.launcher.n_jobs=2"]
    assert left_out == ["-m", f"resume=runs/{PLACEHOLDER}"]
    # resume_overrides goes with resume=, and stays (to be refused) without it
    assert as_composed(("resume=runs/x", "total_frames=9", "resume_overrides=[total_frames]")
                       ) == (["total_frames=9"],
                             ["resume=runs/x", "resume_overrides=[total_frames]"])
    assert as_composed(("resume_overrides=[total_frames]",))[0] == [
        "resume_overrides=[total_frames]"]
    assert shell_words("pip install -e . && python run.py env=Pong; ls") == [
        ["pip", "install", "-e", "."], ["python", "run.py", "env=Pong"], ["ls"]]
    error, _ = composing_error(("agent.optimizer.lrr=1",))
    assert error and error.startswith("distrl: error:") and "lrr" in error
