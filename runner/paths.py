"""Where a mode writes its main output."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from runner.errors import ConfigError

log = logging.getLogger(__name__)


def run_dir(cfg: Any) -> Path:
    """The run's own directory (Hydra's output dir), or the replay file's directory outside Hydra."""
    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # not running under Hydra
        return Path(cfg.replay.save).parent


def output_path(option: Optional[str], default: str) -> Path:
    """The output file for ``output=``: relative to the working directory in a single run, and
    inside the job's own directory in a multirun (so sweep jobs never overwrite each other).

    Raises:
        ConfigError: when the output's directory does not exist.
    """
    path = Path(option or default)
    try:
        hydra_cfg: Any = HydraConfig.get()
        multirun = hydra_cfg.mode == RunMode.MULTIRUN
    except ValueError:  # not running under Hydra (library use, tests)
        multirun = False
    if multirun:
        if path.is_absolute():
            log.warning("output=%s is shared by every job of this sweep; give a relative path to get one per job", path)
        else:
            path = Path(hydra_cfg.runtime.output_dir) / path
    if not path.parent.is_dir():
        raise ConfigError(f"output={path}: directory {path.parent} does not exist; create it or choose another path")
    return path
