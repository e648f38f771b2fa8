"""Entry point: ``python -m runner key=value ...`` (Hydra overrides; see conf/)."""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

import conf
from runner.config import register_configs

CONF_DIR = str(Path(conf.__file__).resolve().parent)
_exit_codes: list[int] = []

register_configs()


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    """Run one job (or one job of a multirun sweep) and remember its exit code."""
    from runner.app import run

    _exit_codes.append(run(cfg))


if __name__ == "__main__":
    main()
    sys.exit(max(_exit_codes, default=0))
