"""Entry point: ``python -m runner key=value ...`` (Hydra overrides; see conf/).

Only the standard library is imported before the guard below, so Ctrl-C, SIGTERM or SIGHUP at
any moment (even while the heavy imports load) ends the process quietly with 128 + the signal,
and a closed stdout or stderr (``| head``, a closed ``less``) only silences the output
(``runner.terminal.pipes``): the run goes on and writes its answer and summary.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, cast

from runner.terminal import pipes, signals  # standard library only

#: when this process started running the tool (``time.monotonic``): the first job's start, so that its
#: ``budget.seconds`` and ``wall_s`` count the imports and Hydra's composition; later jobs of a sweep start when
#: they start
_LAUNCHED = [time.monotonic()]


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


def snapshot_run_dirs(argv: list[str]) -> list[str]:
    """Give a re-run from a config snapshot (``--config-path outputs/.../.hydra``) the project's run
    directories (microseconds and a per-process id, ``conf/config.yaml``) unless it names its own:
    a snapshot holds no ``hydra:`` section, so Hydra's one-second default would make two re-runs
    started in the same second collide."""
    if not any(a in ("--config-path", "-cp") or a.startswith(("--config-path=", "-cp=")) for a in argv):
        return list(argv)
    from omegaconf import OmegaConf

    import conf

    raw = OmegaConf.to_container(OmegaConf.load(Path(conf.__file__).resolve().parent / "config.yaml"), resolve=False)
    own = cast(Dict[str, Any], raw)["hydra"]  # the interpolations themselves, unresolved
    out = list(argv)
    for key, value in (("hydra.run.dir", own["run"]["dir"]), ("hydra.sweep.dir", own["sweep"]["dir"])):
        if not any(a.lstrip("+~").startswith(key + "=") for a in argv):
            out.append(f"{key}={value}")
    return out


def _hydra_main() -> int:
    """Compose the config with Hydra and run the job(s); the exit code of the worst job."""
    import logging

    import hydra
    from omegaconf import DictConfig

    import conf
    from runner.config_keys import register_configs

    logging.raiseExceptions = False  # a log line to a closed stdout/terminal is dropped, not a traceback
    # Hydra prints a bad override as several lines and exits 1; raised instead, cli() says it in one (exit 2)
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    register_configs()
    codes: list[int] = []  # Hydra drops the task's return value; a sweep's jobs append theirs here

    @hydra.main(version_base=None, config_path=str(Path(conf.__file__).resolve().parent), config_name="config")
    def main(cfg: DictConfig) -> None:
        from runner.run.app import run  # imported for a run only: --help needs none of onnx, onnxruntime, numpy

        codes.append(run(cfg, started=_LAUNCHED.pop() if _LAUNCHED else None))

    with _one_composition(sys.argv[1:]):
        main()
    return max(codes, default=0)


@contextlib.contextmanager
def _one_composition(args: List[str]) -> Iterator[None]:
    """Compose the config once, not twice. ``hydra.main`` composes the whole config a first time only to
    read ``hydra.mode`` (``Hydra.get_mode``, 0.1-0.2 s a run), and when that finds none it takes the mode
    from ``--multirun``/``-m``, as it does here: the first composition is skipped unless the mode may come
    from the config itself (an override of ``hydra.mode``, or a config of the user's: ``--config-path``,
    ``--config-name``)."""
    from hydra._internal.hydra import Hydra

    own_config = ("hydra.mode", "+hydra.mode", "--config-path", "-cp", "--config-name", "-cn")
    if any(a.startswith(own_config) for a in args) or not hasattr(Hydra, "get_mode"):
        yield
        return
    original = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Hydra.get_mode = original  # type: ignore[method-assign]


def cli() -> int:
    """Run ``python -m runner``; returns the process exit code."""
    signals.install()
    pipes.guard_streams()  # a reader that goes away (| head) silences output, never the run
    try:
        if sys.argv[1:] in (["--help"], ["-h"]):  # every key of every group, without composing a config
            from runner.terminal.help import render

            print(render())
            return 0
        sys.argv = snapshot_run_dirs(absolute_config_path(sys.argv))
        code = _hydra_main()
        sys.stdout.flush()
        return code
    except KeyboardInterrupt as e:
        return signals.exit_code(e)
    except SystemExit as e:  # a Hydra callback's verdict on a whole sweep (runner.run.sweep)
        return e.code if isinstance(e.code, int) else 2
    except BrokenPipeError:
        # the reader of stdout went away (e.g. "| head"): nothing more to say, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        line = composition_error(e)
        if line is None and isinstance(e, OSError):  # Hydra's own writes: the run directory, its config snapshot
            where = f"{e.filename}: " if e.filename else ""
            line = (
                f"cannot write the run directory ({where}{e.strerror or e}); free some space, lift the "
                "file-size limit (ulimit -f), or set hydra.run.dir= to a writable folder"
            )
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2


def composition_error(e: BaseException) -> Optional[str]:
    """One line for an override Hydra cannot compose (an unknown key, a value of the wrong type or not
    among an enum's, a group option that does not exist), naming the override and the fix; None for
    any other exception.

    Args:
        e: what composing the config (``hydra.main``) raised.
    """
    import itertools

    from hydra.errors import HydraException, MissingConfigException, OverrideParseException

    if not isinstance(e, HydraException):
        return None
    text = [line.strip() for line in str(e).splitlines() if line.strip()]
    cause = [line.strip() for line in str(e.__cause__ or "").splitlines() if line.strip()]
    if isinstance(e, MissingConfigException) and text:
        lines = str(e).splitlines()
        start = next((i + 1 for i, line in enumerate(lines) if line.startswith("Available options")), len(lines))
        options = list(itertools.takewhile(lambda line: line.startswith("\t"), lines[start:]))
        where = text[0].split("Could not find ")[-1].strip("'")
        group, _, name = where.rpartition("/")
        known = ", ".join(o.strip() for o in options)
        return f"{group}={name}: no such {group}" + (f"; use one of {known}" if known else "")
    if isinstance(e, OverrideParseException):
        override = str(getattr(e, "override", "") or "")
        where = f" in {override}" if override else ""
        key, equals, value = override.partition("=")
        if equals and value and not value.startswith(("[", "{", "'", '"')):  # a path or name with ( ) , : ...
            fix = f"quote the value for Hydra, inside the shell's quotes: '{key}=\"{value}\"'"
        else:
            fix = "quote values with brackets, braces or spaces for the shell, e.g. "
            fix += "'model_input_shapes={x:[1,3,224,224]}'"
        return f"cannot read the override{where}: {text[0] if text else e}; {fix}"
    first = text[0] if text else type(e).__name__
    override = first.split("override ", 1)[1] if first.startswith("Error merging override ") else ""
    if first.startswith("Could not override"):
        key = first.split("'")[1] if "'" in first else first
        return (
            _group_key_hint(key, cause)
            or f"{key}= is not an option; see python -m runner --help for the options of each mode"
        )
    why = cause[0] if cause else (text[1] if len(text) > 1 else "")
    head = override or first.rstrip(".")
    return f"{head}: {why}; see python -m runner --help for each key's values" if why else head


def _group_key_hint(key: str, cause: List[str]) -> Optional[str]:
    """For a key of the checker or executor group that the chosen option's schema lacks (Hydra's cause
    names the schema: ``Key 'gpus' not in 'SerialExecutorConf'``): the line that names the chosen option
    and the options that take the key (``runner.config_keys.not_used``); None for any other key."""
    import dataclasses
    import re

    group, _, name = key.partition(".")
    found = re.search(r"not in '(\w+(?:Checker|Executor)Conf)'", " ".join(cause))
    if group not in ("checker", "executor") or not found or "." in name:
        return None
    import conf
    from runner import config as schemas
    from runner.config_keys import not_used

    names = conf.groups(group)
    chosen = next((n for n in names if conf.schema_name(group, n) == found.group(1)), found.group(1))
    users = [
        n for n in names if name in {f.name for f in dataclasses.fields(getattr(schemas, conf.schema_name(group, n)))}
    ]
    return not_used(key, group, chosen, users)


if __name__ == "__main__":
    sys.exit(cli())
