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


def absolute_config_path(argv: list[str]) -> list[str]:
    """Make a relative ``--config-path``/``-cp`` relative to the working directory.

    Hydra resolves a relative config path against the package that declares ``@hydra.main``;
    a user re-running ``outputs/DATE/TIME/.hydra`` means the directory they can see.
    """
    out = list(argv)
    for i, arg in enumerate(out):
        for flag in ("--config-path", "-cp"):
            if arg == flag and i + 1 < len(out) and not Path(out[i + 1]).is_absolute():
                out[i + 1] = str(Path(out[i + 1]).resolve())
            elif arg.startswith(flag + "=") and not Path(arg.split("=", 1)[1]).is_absolute():
                out[i] = f"{flag}={Path(arg.split('=', 1)[1]).resolve()}"
    return out


if __name__ == "__main__":
    from runner.app import EXIT_CODES

    sys.argv = absolute_config_path(sys.argv)
    main()
    sys.exit(max(EXIT_CODES, default=0))
