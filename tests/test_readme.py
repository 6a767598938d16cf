"""The README is tested: every command it shows runs, and prints what it shows.

How the README is read:

- A fenced block (no language, or ``console``) whose first line starts with ``$ `` is a shell
  session: each ``$ COMMAND`` line is run by bash in the repository root with the venv's ``bin``
  first on ``PATH`` (pipes, ``grep``, ``head`` and ``# comments`` as a reader would type them),
  and the lines after it, up to the next ``$`` line, are its output. A command without output
  lines is checked for exit status 0 only.
- Output is compared line by line, trailing whitespace dropped, rich tables as printed into a
  pipe (160 columns). In an output, ``...`` stands for text left out: a line that is only
  ``...`` matches any number of lines (none included), and ``...`` inside a line matches any
  text there.
- A ``python`` block runs as a script in the repository root; a bare block right after it (blank
  lines between at most) is its output. A block that does not import apportion continues the
  block before it (and that block's own chain), and runs after it in the same script.
- No other fenced block may hold an ``apportion`` command: every command the README shows is run.

Commands in ``SLOW``, commands that export a PyTorch model (``--torch``) or time kernels on this
machine, and python blocks that import torch, take too long for the default suite and are marked
slow (``make test-all`` runs them); commands in ``TIMED`` print times, so their output is compared
with every number as a wildcard (and runs of spaces or table rules as one, and a bench goal's
verdict and worst case left out), which checks the table's structure, not the numbers.

A checked output's line (``max abs err A  max rel err B  tol ...  ok``) shows rounding, which
differs between CPUs and BLAS builds: its two error figures match any number, while the
tolerance it states and its verdict must match as shown; the checks in ``PERTURBED`` run again
with BLAS at other thread counts to show that the rule holds.

``python -m tests.test_readme --update COMMAND...`` runs the named commands (as the README spells
them) and writes their output into the README, for a change that is meant to change it (an
excerpt, an output with ``...``, is replaced whole: cut it again by hand).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from apportion.bench.goals import INCONCLUSIVE

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent

#: commands too slow for CI, with the reason (each must be a command of the README)
SLOW: dict[str, str] = {
    "apportion run --torch apportion.frontend.torch_demo:tiny_gpt2 --backend iree --check "
    "--cores 8": "compiles every segment of the model with IREE: about 40 s",
    "apportion run examples/mlp.json --mesh dp=2 --backend dtensor --check":
        "starts two torch.distributed processes",
    "apportion run --torch apportion.frontend.torch_demo:mlp --mesh tp=2 --backend dtensor "
    "--check": "exports a model and starts two torch.distributed processes",
    "apportion run --torch apportion.frontend.torch_demo:tiny_llama --mesh tp=2 --check":
        "exports a Llama and plans every device's segments",
    "apportion bench conformance --n 60": "plans 60 random programs and runs them in IREE",
    "apportion plan --torch apportion.frontend.torch_models:llama3_8b | tail -2":
        "exports and plans Llama-3-8B from the meta device: 35-100 s",
    "apportion bench scale": "plans a 160-layer forward pass and a 20,000-op chain, 3 times",
    "apportion bench sharding": "the sharding search on every model and mesh",
    "apportion bench tiling": "plans every block of models.json twice",
    "apportion bench e2e": "exports three PyTorch models and times them, 5 runs a side",
    "apportion bench splitk --check": "compiles 35 split-K plans with IREE and times them",
    "apportion bench forall": "JIT-compiles five programs with upstream MLIR and times them",
    "apportion bench upstream --limit 3 --n 3": "runs upstream mlir-opt on six programs",
    "apportion run examples/halo.json --mesh die=3@chiplet:peered --backend iree --check":
        "compiles every device's segments with IREE",
    "apportion bench workdiv": "plans 797 op shapes with three strategies, twice",
}

#: commands whose output holds times measured on this machine
TIMED: set[str] = {
    "apportion run examples/attention.json --backend iree --check",
    "apportion run examples/merge_heads.json --cores 32 --backend iree --check",
    "apportion run examples/mlp.json --mesh dp=2 --backend dtensor --check",
    "apportion run --torch apportion.frontend.torch_demo:mlp --mesh tp=2 --backend dtensor "
    "--check",
    "apportion shard examples/mlp.json --mesh tp=4",
    "apportion bench workdiv",
    "apportion bench scale",
    "apportion bench costmodel --target cpu",
    "apportion bench sharding",
    "apportion bench e2e",
    "apportion bench splitk --check",
    "apportion bench forall",
    "apportion cuda build examples/megatron.json --cores 132 --out build/cuda/megatron",
}

#: a python block that imports torch (or continues one that does) exports models from
#: transformers with torch.export: too slow for CI
IMPORTS_TORCH = re.compile(r"^import .*\btorch\b", re.M)


@dataclass(frozen=True)
class Block:
    """A fenced block: its language, its lines, and where it starts and ends (1-based lines
    of the fences)."""

    start: int
    end: int
    lang: str
    lines: tuple[str, ...]

    @property
    def is_session(self) -> bool:
        return self.lang in ("", "console") and bool(self.lines) and \
            self.lines[0].startswith("$ ")


@dataclass(frozen=True)
class Command:
    """A ``$ command`` of the README and the output shown after it (none: not shown)."""

    line: int
    command: str
    expected: tuple[str, ...]


@dataclass(frozen=True)
class Snippet:
    """A python block, the blocks it continues, and the output block after it."""

    line: int
    code: str
    first: str
    expected: tuple[str, ...] | None


def blocks(text: str) -> list[Block]:
    """Every fenced block of a markdown text."""
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if m is None:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        out.append(Block(i + 1, j + 1, m.group(1), tuple(lines[i + 1:j])))
        i = j + 1
    return out


def commands(bs: list[Block]) -> list[Command]:
    """The ``$`` commands of the shell sessions, each with the output lines after it."""
    out: list[Command] = []
    for b in bs:
        if not b.is_session:
            continue
        current: tuple[int, str] | None = None
        shown: list[str] = []
        for k, line in enumerate(b.lines):
            if line.startswith("$ "):
                if current is not None:
                    out.append(Command(current[0], current[1], tuple(shown)))
                current, shown = (b.start + 1 + k, line[2:].strip()), []
            else:
                shown.append(line)
        assert current is not None
        out.append(Command(current[0], current[1], tuple(shown)))
    return out


IMPORTS_APPORTION = re.compile(r"^(import .*\bapportion\b|from apportion\b)", re.M)


def snippets(text: str, bs: list[Block]) -> list[Snippet]:
    """The python blocks, each with the code it continues and the output block after it."""
    lines = text.splitlines()
    out: list[Snippet] = []
    chain = ""
    for k, b in enumerate(bs):
        if b.lang != "python":
            continue
        code = "\n".join(b.lines) + "\n"
        chain = code if IMPORTS_APPORTION.search(code) else chain + code
        after = bs[k + 1] if k + 1 < len(bs) else None
        expected = None
        if after is not None and after.lang == "" and not after.is_session and \
                all(not s.strip() for s in lines[b.end:after.start - 1]):
            expected = after.lines
        out.append(Snippet(b.start, chain, b.lines[0], expected))
    return out


TEXT = README.read_text()
BLOCKS = blocks(TEXT)
COMMANDS = commands(BLOCKS)
SNIPPETS = snippets(TEXT, BLOCKS)

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
_RULES = re.compile(r"([━─═ ])\1+")
_VERDICT = re.compile(r"^goal (?:met|MISSED|inconclusive):")
_BY = re.compile(r", (?:(?:over|short of) the goal by|too noisy:) .*$")
_CASE = re.compile(r"\([^()]*\)")


def _timed(line: str) -> str:
    """A line with every number as ``0`` and runs of spaces or table rules as one; of a bench
    goal's line, the verdict (met, MISSED or inconclusive, and by how much or why) and the
    worst case named in parentheses are left out too: with times in the figure, they vary from
    run to run."""
    if _VERDICT.match(line):
        line = _CASE.sub("()", _BY.sub("", _VERDICT.sub("goal:", line)))
    return _RULES.sub(r"\1", _NUMBER.sub("0", line))


#: a checked output's line: its error figures are rounding, which differs between CPUs and BLAS
#: builds (float16 accumulation order); what the README promises is the verdict under the tolerance
#: the line states, so the figures match any number and the rest of the line (tolerance, verdict)
#: must match as shown
_ERRORS = re.compile(r"(max (?:abs|rel) err )(?:[-+]?\d[\d.]*(?:e[-+]?\d+)?|nan|inf)")
_CHECKED = re.compile(r"max abs err .* max rel err .* tol .* ok$")
_FIGURE = "\x00"  # a placeholder no README line holds


def _figures(line: str) -> str:
    """A checked output's line with its error figures as placeholders (any number); other
    lines as they are."""
    if _CHECKED.search(line.rstrip()):
        return _ERRORS.sub(lambda m: m.group(1) + _FIGURE, line)
    return line


def _pattern(line: str) -> re.Pattern[str]:
    parts = [re.escape(part) for part in line.split("...")]
    # the placeholder of _figures: a non-negative number, an error figure of a checked line
    body = ".*".join(p.replace(_FIGURE, r"(?:\d[\d.]*(?:e[-+]?\d+)?)") for p in parts)
    return re.compile(body + r"\Z")


def matches(expected: tuple[str, ...] | list[str], actual: list[str], timed: bool = False
            ) -> bool:
    """Whether ``actual`` lines are what ``expected`` shows (``...`` as a wildcard)."""
    norm = _timed if timed else (lambda s: s)
    want = [_figures(norm(s.rstrip())) for s in expected]
    got = [norm(s.rstrip()) for s in actual]
    while want and not want[-1]:
        want.pop()
    while got and not got[-1]:
        got.pop()
    memo: dict[tuple[int, int], bool] = {}

    def at(i: int, j: int) -> bool:
        if (i, j) in memo:
            return memo[i, j]
        if i == len(want):
            ok = j == len(got)
        elif want[i].strip() == "...":
            ok = at(i + 1, j) or (j < len(got) and at(i, j + 1))
        else:
            ok = j < len(got) and _pattern(want[i]).match(got[j]) is not None and at(i + 1, j + 1)
        memo[i, j] = ok
        return ok

    return at(0, 0)


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(home)  # a fresh IREE module cache: every module compiles, as shown
    env.pop("COLUMNS", None)
    env.pop("SENCORES", None)
    return env


def run_command(command: str, home: Path, threads: int | None = None
                ) -> subprocess.CompletedProcess[str]:
    env = _env(home)
    if threads is not None:  # another BLAS and OpenMP thread count: other accumulation orders
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[name] = str(threads)
    if "bench splitk" in command:  # as a user runs it: this host's table, measured on first use
        env.pop("APPORTION_CPU_SPLIT_K", None)
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200, check=False)


def _diff(expected: tuple[str, ...], actual: str) -> str:
    return "\n--- README shows:\n" + "\n".join(expected) + "\n--- the command printed:\n" + actual


#: commands that export a PyTorch model (``--torch``: 5-20 s each) or time kernels on this
#: machine take too long for the default suite too: marked slow as the SLOW ones are
EXPORTS_TORCH = re.compile(r"\s--torch\s")
TIMES_THIS_MACHINE = {"apportion bench costmodel --target cpu"}


def _param(c: Command) -> object:
    slow = c.command in SLOW or c.command in TIMES_THIS_MACHINE or \
        EXPORTS_TORCH.search(c.command) is not None
    marks = [pytest.mark.slow] if slow else []
    return pytest.param(c, id=f"line{c.line}:{c.command[:60]}", marks=marks)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.mark.parametrize("command", [_param(c) for c in COMMANDS])
def test_readme_command_prints_what_the_readme_shows(command: Command, home: Path) -> None:
    done = run_command(command.command, home)
    # a timed --check too noisy to judge on this machine (exit 3) is no failure of the README
    ok = (0, INCONCLUSIVE) if command.command in TIMED else (0,)
    assert done.returncode in ok, f"README line {command.line}: {command.command}\n{done.stderr}"
    if not any(s.strip() for s in command.expected):
        return
    if not matches(command.expected, done.stdout.splitlines(), command.command in TIMED):
        pytest.fail(f"README line {command.line}: {command.command}"
                    + _diff(command.expected, done.stdout), pytrace=False)


#: README checks whose figures are float16 or float32 rounding of BLAS matmuls: run again with
#: BLAS at other thread counts, they must still match what the README shows
PERTURBED = [c for c in COMMANDS if c.command in {
    "apportion run examples/mlp.json --target spyre --cores 8 --check",
    "apportion run examples/attention.json --cores 8 --backend torch --threads 2 --check",
    "apportion run examples/mlp.json --mesh tp=N~2..8 --param N=3 --check",
}]


@pytest.mark.parametrize("threads", [3])  # an odd count, unlike any default
@pytest.mark.parametrize("command", PERTURBED, ids=lambda c: f"line{c.line}")
def test_readme_checks_match_with_blas_at_another_thread_count(command: Command, threads: int,
                                                                home: Path) -> None:
    done = run_command(command.command, home, threads=threads)
    assert done.returncode == 0, f"README line {command.line}: {command.command}\n{done.stderr}"
    assert matches(command.expected, done.stdout.splitlines()), \
        f"README line {command.line} at {threads} threads" + _diff(command.expected, done.stdout)


def test_perturbed_checks_name_commands_of_the_readme() -> None:
    assert len(PERTURBED) == 3, [c.command for c in PERTURBED]


def _snippet_param(s: Snippet) -> object:
    marks = [pytest.mark.slow] if IMPORTS_TORCH.search(s.code) else []
    return pytest.param(s, id=f"line{s.line}:{s.first[:50]}", marks=marks)


@pytest.mark.parametrize("snippet", [_snippet_param(s) for s in SNIPPETS])
def test_readme_python_block_runs_and_prints_what_the_readme_shows(snippet: Snippet,
                                                                   tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code)
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, f"README line {snippet.line}\n{done.stderr}"
    if snippet.expected is not None and not matches(snippet.expected, done.stdout.splitlines()):
        pytest.fail(f"README line {snippet.line}" + _diff(snippet.expected, done.stdout),
                    pytrace=False)


def test_every_apportion_command_of_the_readme_is_run() -> None:
    for b in BLOCKS:
        if b.is_session or b.lang == "python":
            continue
        stray = [s for s in b.lines if re.match(r"\s*(\$\s*)?apportion\s", s)]
        assert not stray, f"README line {b.start}: a command outside a $ session: {stray}"


def test_slow_and_timed_commands_name_commands_of_the_readme() -> None:
    shown = {c.command for c in COMMANDS}
    assert set(SLOW) <= shown, set(SLOW) - shown
    assert shown >= TIMED, TIMED - shown


def test_every_example_file_the_readme_names_ships() -> None:
    named = set(re.findall(r"examples/[\w./-]+?\.json", TEXT))
    assert named, "the README names no example"
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, missing
    bare = sorted(set(re.findall(r"(?<![\w/.-])[\w-]+\.json\b", TEXT)) -
                  {"models.json", "spyre_measurements.json", "cpu_measurements.json",
                   "m.json"})
    assert not bare, f"program files named without examples/: {bare}"


def test_matching_rules() -> None:
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["a", "...", "b"], ["a", "b"])
    assert matches(["loop group [0] (e): 5 over b; ..."], ["loop group [0] (e): 5 over b; x y"])
    assert not matches(["a", "b"], ["a", "c"])
    assert not matches(["a"], ["a", "b"])
    assert matches(["x  "], ["x", ""])
    assert matches(["│ 32 │ 0.41 │"], ["│ 32 │ 10.5 │"], timed=True)
    assert not matches(["│ 32 │ 0.41 │"], ["│ 32 │ 0.41 │ 7 │"], timed=True)
    assert matches(["┏━━┳━━┓"], ["┏━━━━┳━┓"], timed=True)
    assert matches(["goal MISSED: at most 40x: 116.0x (gpt2), over the goal by 76.0x"],
                   ["goal met: at most 40x: 12.5x (llama at 32 cores)"], timed=True)
    assert not matches(["goal met: at most 40x: 1x"], ["goal met: at least 40x: 1x"], timed=True)
    # a timed goal too noisy to judge on a loaded machine matches the README's verdict
    assert matches(["goal met: at most 2x: 1.29x [1.27x, 1.31x] (mlp at 32 cores)"],
                   ["goal inconclusive: at most 2x: 1.95x [1.80x, 2.21x] (gpt2 at 32 cores), too "
                    "noisy: its interval 1.8 to 2.21 holds the bound 2"], timed=True)


def test_error_figures_of_a_checked_line_match_any_number_but_not_another_verdict() -> None:
    shown = ["           y   float16  max abs err 0  max rel err 0  tol atol=0.01 rtol=0.01  ok"]
    assert matches(shown, ["           y   float16  max abs err 0.0312  max rel err 0.000826  "
                           "tol atol=0.01 rtol=0.01  ok"])
    assert matches(shown, ["           y   float16  max abs err 4.17e-07  max rel err 1e-05  "
                           "tol atol=0.01 rtol=0.01  ok"])
    assert not matches(shown, ["           y   float16  max abs err 0.5  max rel err 0.2  "
                               "tol atol=0.01 rtol=0.01  MISMATCH"])
    assert not matches(shown, ["           y   float16  max abs err 0  max rel err 0  "
                               "tol atol=0.1 rtol=0.01  ok"])
    assert not matches(shown, ["           y   float32  max abs err 0  max rel err 0  "
                               "tol atol=0.01 rtol=0.01  ok"])
    # a line that is not a check's keeps its figures literal
    assert not matches(["max abs err 0 of nothing"], ["max abs err 1 of nothing"])


def update(names: list[str]) -> None:
    """Write the output of each named command into the README, in place of what it shows."""
    text = README.read_text()
    lines = text.splitlines()
    home = Path(tempfile.mkdtemp(prefix="readme-home-"))
    for c in sorted(commands(blocks(text)), key=lambda c: -c.line):
        if c.command not in names:
            continue
        done = run_command(c.command, home)
        if done.returncode != 0:
            raise SystemExit(f"{c.command}: exit {done.returncode}\n{done.stderr}")
        new = [s.rstrip() for s in done.stdout.rstrip("\n").splitlines()]
        start = c.line  # the $ line (1-based) is lines[c.line - 1]; output follows it
        lines[start:start + len(c.expected)] = new
        print(f"updated line {c.line}: {c.command} ({len(new)} lines)")
    README.write_text("\n".join(lines) + "\n")


def test_the_cpu_costmodel_output_leaves_out_what_the_leave_one_out_refit_decides_per_machine():
    # the refit of the cpu preset without each shape is ill-conditioned (README): its notes and
    # its rank goal differ between CPUs and BLAS builds, so the README shows them as ``...``;
    # an --update that pasted one machine's lines back would fail on the others
    (shown,) = [c for c in COMMANDS if c.command == "apportion bench costmodel --target cpu"]
    other, in_table = [], False
    for s in shown.expected:
        in_table = (in_table or "┃ note ┃" in s) and not s.startswith("└")
        if in_table and s.startswith("│ "):
            s = re.sub(r"│[^│]*│$", "│ 1 tied, ranked ahead; MISS │", s)
        if s.startswith("goal ") and "left out of the fit, the measured-best split ranks" in s:
            s = s[:s.index("ranks first: ")] + "ranks first: 2 of 13 miss it: 512x512x2048@2 " \
                "ranks 2 of 4 (balanced picks m2 n1 k1)"
        other.append(s)
    assert sum("ranked ahead; MISS" in s for s in other) == 13  # one row per cpu shape
    assert sum("ranks first: 2 of 13 miss it" in s for s in other) == 1
    assert matches(shown.expected, other, timed=True)


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--update":
        raise SystemExit("usage: python -m tests.test_readme --update 'apportion ...' ...")
    update(sys.argv[2:])
