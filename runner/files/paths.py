"""Where a run writes: its run directory, and output paths inside a sweep's job directories."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

log = logging.getLogger(__name__)


def run_dir(cfg: Any) -> Path:
    """The run's own directory (Hydra's output dir), or the replay file's directory outside Hydra."""
    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # not running under Hydra
        return Path(cfg.replay.save).parent


def in_job_dir(option: str, value: Optional[str]) -> Optional[str]:
    """A relative output path moved into the job's own directory in a multirun (so sweep jobs never
    overwrite each other); unchanged in a single run. An absolute path in a sweep is a warning."""
    if not value:
        return value
    try:
        hydra_cfg: Any = HydraConfig.get()
        multirun = hydra_cfg.mode == RunMode.MULTIRUN
    except ValueError:  # not running under Hydra (library use, tests)
        return value
    if not multirun:
        return value
    if Path(value).is_absolute():
        log.warning(
            "%s=%s is shared by every job of this sweep; give a relative path to get one per job", option, value
        )
        return value
    return str(Path(hydra_cfg.runtime.output_dir) / value)
