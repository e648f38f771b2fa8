"""Running a job in-process: Hydra's compose API, then ``runner.run.app.run`` as ``python -m runner`` would.

Composes the same config (``conf/``, the same overrides), sets the Hydra runtime the way Hydra's
``run_job`` does (run directory, ``HydraConfig``), logs to the console stream and ``runner.log``
as Hydra's job logging does, and captures stdout and stderr. No interpreter start-up per run, so
mode tests cost what the mode costs.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from pathlib import Path
from typing import List, Optional

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import conf
from runner.api import run_composed
from runner.config_keys import register_configs
from runner.files.rundir import RunDirGuard, release_run_dir
from tests.helpers.cli import RunResult

CONF_DIR = str(Path(conf.__file__).resolve().parent)
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def ensure_hydra() -> None:
    """Initialize Hydra on ``conf/`` once for this process (initializing costs more than composing)."""
    register_configs()
    if not GlobalHydra.instance().is_initialized():
        initialize_config_dir(config_dir=CONF_DIR, version_base=None, job_name="runner")


def run_in_process(
    tmp_path: Path,
    name: str,
    *overrides: str,
    cwd: Optional[Path] = None,
    run_dir: Optional[Path] = None,
    started: Optional[float] = None,
) -> RunResult:
    """Compose ``overrides`` and run the job in this process, its run directory ``tmp_path/name``; ``started``:
    when the run started (``time.monotonic``), as ``python -m runner`` gives its launch (None: now).

    Raises:
        hydra.errors.ConfigCompositionException: for an override Hydra rejects (the CLI exits 1).
    """
    ensure_hydra()
    run_dir = Path(run_dir or tmp_path / name).absolute()
    cfg = compose("config", overrides=[*overrides, f"hydra.run.dir={run_dir}"], return_hydra_config=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    out, err = io.StringIO(), io.StringIO()
    try:  # as Hydra's launcher does, before its job logging opens runner.log there
        with contextlib.redirect_stderr(err):
            RunDirGuard().on_run_start(cfg)
    except SystemExit as e:
        release_run_dir(run_dir)  # as the process that exits would
        return RunResult(int(e.code or 0), "", err.getvalue(), run_dir)
    # the directory is locked by this process from here: the run takes it over
    root = logging.getLogger()
    handlers: List[logging.Handler] = [logging.StreamHandler(out), logging.FileHandler(run_dir / "runner.log")]
    for h in handlers:
        h.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(h)
    level = root.level
    root.setLevel(logging.INFO)
    previous_cwd = os.getcwd()
    try:
        os.chdir(cwd or tmp_path)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run_composed(cfg, run_dir, started=started)
    finally:
        release_run_dir(run_dir)  # a run that stopped before it took the directory over: as its process's end
        os.chdir(previous_cwd)
        root.setLevel(level)
        for h in handlers:
            root.removeHandler(h)
            h.close()
    return RunResult(code, out.getvalue(), err.getvalue(), run_dir)
