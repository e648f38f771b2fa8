"""Entry point: ``python -m runner key=value ...`` (Hydra overrides; see conf/)."""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

import conf
from runner.config import register_configs

CONF_DIR = str(Path(conf.__file__).resolve().parent)

register_configs()


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    """Run one job (or one job of a multirun sweep) and remember its exit code."""
    from runner.app import EXIT_CODES, run

    EXIT_CODES.append(run(cfg))


if __name__ == "__main__":
    from runner.app import EXIT_CODES

    main()
    sys.exit(max(EXIT_CODES, default=0))
