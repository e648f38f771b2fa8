"""Benchmark: the start-up of a run (issue 55), a 1-check run against Polygraphy's.

Times ``python -m runner mode=repeat until=1 checker.cmd=true`` (one check of a command that exits 0,
no model) and ``polygraphy debug repeat --until 1 --check true`` (the same with Polygraphy, when it is
installed), each ``--runs`` times in turn, in a fresh directory; prints the median and the fastest
wall seconds of each. Then, in one fresh process, where the runner's own start goes: Python itself,
importing Hydra, the project's modules (``runner.config_keys``), storing the schemas
(``register_configs``), one composition of the config, and the lifecycle's imports (``transitions``,
``tqdm``); and which heavy modules a run of no model imported (``scripts/imported_modules.py``: none, since 0.54).

Usage: python benchmarks/startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from _common import ROOT, print_rows, runner_cmd

RUN = ["mode=repeat", "until=1", "checker.cmd=true"]

#: one process: the seconds of each start-up phase, and the heavy modules a run of no model imports
PHASES = """
import json, sys, time
began = time.perf_counter()
import hydra
hydra_s = time.perf_counter()
import conf
from runner.config_keys import register_configs
project_s = time.perf_counter()
register_configs()
registered_s = time.perf_counter()
from hydra import compose, initialize_config_dir
from pathlib import Path
with initialize_config_dir(version_base=None, config_dir=str(Path(conf.__file__).parent)):
    compose("config", overrides=sys.argv[1:])
composed_s = time.perf_counter()
import transitions, tqdm
lifecycle_s = time.perf_counter()
print(json.dumps({
    "import hydra": hydra_s - began, "import the project's keys": project_s - hydra_s,
    "store the schemas": registered_s - project_s, "compose the config": composed_s - registered_s,
    "import transitions, tqdm": lifecycle_s - composed_s,
}))
"""

#: runs a command line in a fresh process, then prints the heavy modules it imported
IMPORTED = ROOT / "scripts" / "imported_modules.py"


def wall(cmd: List[str], cwd: Path) -> float:
    """Seconds ``cmd`` takes; exits the benchmark with its output when it fails."""
    began = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    seconds = time.monotonic() - began
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-1000:]}{proc.stderr[-1000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each command (the median counts)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="startup_"))
    commands: Dict[str, List[str]] = {
        "python -m runner " + " ".join(RUN): runner_cmd(*RUN, f"hydra.run.dir={work}/run"),
        "python -c pass (Python itself)": [sys.executable, "-c", "pass"],
    }
    polygraphy = shutil.which("polygraphy")
    if polygraphy:
        commands["polygraphy debug repeat --until 1 --check true"] = [
            polygraphy,
            *["debug", "repeat", "--until", "1", "--check", "true"],
        ]
    times: Dict[str, List[float]] = {name: [] for name in commands}
    for _ in range(args.runs):  # in turn: a slow spell of the machine hits every command alike
        for name, cmd in commands.items():
            shutil.rmtree(work / "run", ignore_errors=True)
            times[name].append(wall(cmd, work))
    rows = [
        {"command": name, "median_s": round(statistics.median(t), 3), "fastest_s": round(min(t), 3), "runs": len(t)}
        for name, t in times.items()
    ]
    print_rows(f"Start-up: a 1-check run, {args.runs} runs each", rows)
    phases = subprocess.run([sys.executable, "-c", PHASES, *RUN], cwd=ROOT, capture_output=True, text=True, check=True)
    print_rows(
        "Where the runner's start goes (one process)",
        [{"phase": k, "seconds": round(v, 3)} for k, v in json.loads(phases.stdout.splitlines()[-1]).items()],
    )
    shutil.rmtree(work / "run", ignore_errors=True)
    done = subprocess.run(
        [sys.executable, str(IMPORTED), *RUN, f"hydra.run.dir={work}/run"], cwd=work, capture_output=True, text=True
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("imported:")]
    if done.returncode != 0 or not lines:
        sys.exit(f"the in-process run failed:\n{done.stderr[-1000:]}")
    heavy = lines[-1].removeprefix("imported:").strip()
    print(f"\nA run of no model imported: {heavy or 'none of the heavy modules (scripts/imported_modules.py)'}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
