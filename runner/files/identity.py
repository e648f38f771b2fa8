"""What a run's verdicts depend on, recorded in its replay so that a resume never reuses stale ones.

A verdict belongs to a candidate (its key) checked by one check on one model with one set of
inputs. ``run_identity`` names all of these: the model's content (sha256 of the model file and
its external data), the mode, the check's definition (the checker's options and the content of
every file its command line names, e.g. the check script), the inputs, golden values and input
shapes, and the options that change what a candidate holds.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping

from omegaconf import DictConfig, OmegaConf

from runner.config import plain
from runner.config_keys import candidate_options

#: checker options that change what is printed, not the verdict
DISPLAY_ONLY = {"show_output", "hide_fail_output"}

#: files larger than this (bytes) named on a check's command line are identified by size and time, not content
HASH_LIMIT = 256 * 2**20


def file_digest(paths: Iterable[Path]) -> str:
    """sha256 over the contents of ``paths`` in order (16 hex digits), read in 1 MiB blocks."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(2**20):
                h.update(block)
    return h.hexdigest()[:16]


#: suffixes of files that define what a check does (scripts, configs); data and log files a check
#: writes are left out, or a resume would always look like another check
DEFINING_SUFFIXES = {
    ".py",
    ".sh",
    ".bash",
    ".zsh",
    ".pl",
    ".rb",
    ".js",
    ".json",
    ".yaml",
    ".yml",
    ".toml",
    ".cfg",
    ".ini",
}


def _named_files(cmd: str) -> Dict[str, str]:
    """Digest of each existing file a command line names that defines the check: the program, and
    arguments that are scripts or configs (``DEFINING_SUFFIXES``) or executable files."""
    try:
        argv = shlex.split(cmd)
    except ValueError:
        return {}
    out: Dict[str, str] = {}
    for position, arg in enumerate(argv):
        for part in [arg, *arg.split("=", 1)[1:]]:  # also --flag=path
            p = Path(part)
            try:
                if "{artifact}" in part or not p.is_file():
                    continue
                if position and p.suffix.lower() not in DEFINING_SUFFIXES and not os.access(p, os.X_OK):
                    continue
                st = p.stat()
                out[part] = (
                    file_digest([p]) if st.st_size <= HASH_LIMIT else f"size {st.st_size} mtime {st.st_mtime_ns}"
                )
            except OSError:
                continue
    return out


def _loader_identity(target: str) -> str:
    """``data_loader=pkg.module.fn`` and the digest of the module's source file, found without
    importing it (the name alone when it cannot be found)."""
    import importlib.util

    module = target.rpartition(".")[0]
    try:
        spec = importlib.util.find_spec(module) if module else None
    except (ImportError, ValueError):
        spec = None
    origin = Path(spec.origin) if spec is not None and spec.origin and spec.origin != "built-in" else None
    return f"{target} {file_digest([origin])}" if origin is not None and origin.is_file() else target


def run_identity(cfg: DictConfig, model_files: List[Path]) -> Dict[str, Any]:
    """The identity of a run's verdicts (JSON-able), stored in its replay.

    Args:
        cfg: the run's config.
        model_files: the model and its external data files (``runner.graph.model_files.model_files``).

    Returns:
        ``{"mode", "model", "check", "data", "candidates"}``.
    """
    checker = (
        OmegaConf.to_container(cfg.checker, resolve=True, enum_to_str=True) if cfg.get("checker") is not None else {}
    )
    assert isinstance(checker, dict)
    check: Dict[str, Any] = {str(k): v for k, v in checker.items() if k not in DISPLAY_ONLY}
    if isinstance(check.get("cmd"), str):
        check["files"] = _named_files(check["cmd"])
    data: Dict[str, Any] = {}
    for option in ("inputs", "golden"):
        value = cfg.get(option)
        if value and Path(value).is_file():
            data[option] = file_digest([Path(value)])
    if cfg.get("val_range") is not None:
        data["val_range"] = plain(cfg.get("val_range"))
    if cfg.get("data_loader"):
        data["data_loader"] = _loader_identity(cfg.data_loader)
    candidates = {k: plain(cfg.get(k)) for k in candidate_options() if cfg.get(k) is not None}
    if cfg.get("quantized_model") and Path(cfg.quantized_model).is_file():  # its content, not its name
        from runner.graph.model_files import model_files as files_of

        candidates["quantized_model"] = file_digest(files_of(cfg.quantized_model))
    return {
        "mode": cfg.mode.name,
        "model": file_digest(model_files) if model_files else None,
        "check": check,
        "data": data,
        "candidates": candidates,
    }


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> List[str]:
    """The parts of two identities that differ, as short phrases for an error message."""
    words = {
        "mode": "mode",
        "model": "model content",
        "check": "check",
        "data": "inputs or golden values",
        "candidates": "options",
    }
    out = []
    for part, word in words.items():
        a, b = recorded.get(part), current.get(part)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out.append(f"{word} ({', '.join(map(str, keys))})")
        else:
            out.append(word)
    return out
