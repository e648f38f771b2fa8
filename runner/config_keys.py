"""Which keys each mode and each option takes, checked against the command line.

A mode's keys are the ``KEYS`` dataclass its module exports (``strategies/<mode>.py``), found through
its ``conf/mode/<mode>.yaml``; an option's keys (``executor=...``) are the parameters of the class
its YAML names. A key set for a mode or option that does not use it is a one-line error naming the
ones that do; ``--help`` lists the modes from their YAML files.
"""

from __future__ import annotations

import functools
import re
import secrets
from dataclasses import fields, make_dataclass
from typing import Any, Dict, Iterable, List

from hydra.core.config_store import ConfigStore

from conf import checker_groups, checker_schema, executor_groups, executor_schema, plugin_mode_files
from runner import config
from runner.config import ArtifactsConf, CommonKeys, MarkerConf, ModeConf
from runner.errors import ConfigError, first_line


def _names(cls: type) -> List[str]:
    return [f.name for f in fields(cls)]


def set_keys(overrides: Iterable[str]) -> List[str]:
    """The top-level keys a list of Hydra overrides sets (``+fp16=true`` -> ``fp16``)."""
    return _keys_after("", overrides)


def _keys_after(prefix: str, overrides: Iterable[str]) -> List[str]:
    """The keys right after ``prefix`` (e.g. ``"executor."``) that overrides set, in order, once each."""
    out: List[str] = []
    for text in overrides:
        match = re.match(rf"^[~+]*{re.escape(prefix)}([A-Za-z_][\w-]*)", text)
        if match and match.group(1) not in out:
            out.append(match.group(1))
    return out


def group_specs(group: str) -> Dict[str, Any]:
    """``{option name: its YAML as written}`` (an OmegaConf ``DictConfig``) of a config group, read from
    ``conf/<group>/*.yaml`` (modes also from other packages: ``conf.mode_files``): the group is the one list of its
    options (modes, executors, markers); an option is named by its ``name:``, else by its file."""
    from pathlib import Path

    from omegaconf import DictConfig, OmegaConf

    import conf

    found: Dict[str, Any] = {}
    folder = Path(conf.__file__).resolve().parent / group
    paths = conf.mode_files() if group == "mode" else sorted(folder.glob("*.yaml"))
    for path in paths:
        spec = OmegaConf.load(path)
        if isinstance(spec, DictConfig):
            found[str(spec.get("name") or path.stem)] = spec  # a marker's YAML names none: its file does
    return found


def group_targets(group: str, key: str = "_target_") -> Dict[str, str]:
    """``{option name: its _target_}`` of a config group (``group_specs``). ``key``: another entry of each
    option instead (an option without it is left out)."""
    return {name: str(spec[key]) for name, spec in group_specs(group).items() if spec.get(key) is not None}


@functools.cache
def mode_keys() -> Dict[str, type]:
    """``{mode name: its keys dataclass}``: the class a ``conf/mode/<mode>.yaml`` names (``keys:``, light
    modules: ``strategies.mode_keys``), else the ``KEYS`` of the module of its strategy's ``create``
    (``_target_``, ``strategies.<mode>.<Class>.create``). Start-up reads them all (the YAMLs once).

    Raises:
        ImportError: a module cannot be imported. AttributeError: it exports no such class or ``KEYS``.
    """
    import importlib

    found: Dict[str, type] = {}
    for name, spec in group_specs("mode").items():
        if spec.get("keys") is not None:
            module, _, cls = str(spec["keys"]).rpartition(".")
            found[name] = getattr(importlib.import_module(module), cls)
        else:
            found[name] = target_module(str(spec._target_)).KEYS
    return found


def target_module(target: str) -> Any:
    """The module of a dotted ``_target_`` (``strategies.precision.strategy.PrecisionStrategy.create``): its longest
    prefix that imports.

    Raises:
        ImportError: no prefix imports.
    """
    import importlib

    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            return importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
    raise ImportError(f"no module in {target}")


def run_config() -> type:
    """The top-level schema: every key a user types on the command line, the union of the modes'
    keys (``mode_keys``) and ``CommonKeys``."""
    return make_dataclass("RunConfig", [], bases=(*mode_keys().values(), CommonKeys))


def candidate_options() -> List[str]:
    """The top-level keys marked ``candidate`` in any mode's keys, sorted."""
    return sorted({f.name for cls in mode_keys().values() for f in fields(cls) if f.metadata.get("candidate")})


def mode_uses(mode: str, key: str) -> bool:
    """Whether ``mode`` uses the top-level key ``key`` (its keys dataclass holds it)."""
    return key in _names(mode_keys()[mode])


def not_used(key: str, group: str, chosen: str, users: Iterable[str]) -> str:
    """The one line for a key the chosen option of ``group`` does not take, naming the options that do:
    ``direction= is not used by mode=repeat; it is an option of mode=precision``.

    Args:
        key: the key as typed (``direction``, ``executor.gpus``). group: ``mode``, ``checker`` or
            ``executor``. chosen: the option chosen. users: the options that take the key (none: none named).
    """
    users = list(users)
    where = f"; it is an option of {', '.join(f'{group}={u}' for u in users)}" if users else ""
    return f"{key}= is not used by {group}={chosen}{where}"


def check_mode_keys(mode: str, keys: Iterable[str]) -> None:
    """Check that every key the user set is used by ``mode``.

    Args:
        mode: the mode's name (a key of ``mode_keys()``).
        keys: the top-level keys the user set (``set_keys`` of the overrides).

    Raises:
        ConfigError: a key no mode knows (``+fp16=true``), or one the mode does not use, naming
            the modes that do.
    """
    modes = mode_keys()
    used = set(_names(modes[mode])) | set(_names(CommonKeys))
    for key in keys:
        if key == "hydra" or key in used:
            continue
        users = [m for m, cls in modes.items() if key in _names(cls)]
        if not users:
            raise ConfigError(f"{key}= is not an option; see python -m runner --help for the options of each mode")
        raise ConfigError(not_used(key, "mode", mode, users))


def chosen(config: Any, group: str) -> str:
    """The option of ``group`` a composed config chose: a marker by its ``_target_`` (``minimal``), any other
    group as the dotted key's value (``low_precision`` -> ``float16``)."""
    from omegaconf import OmegaConf

    if group == "marker":
        target = OmegaConf.select(config, "marker._target_")
        names = {t: n for n, t in group_targets("marker").items()}
        return names.get(str(target), str(target))
    if group == "checker":  # a checker's YAML names its schema, whose _target_ is its class
        from conf import checker_groups, checker_schema
        from runner import config as schemas

        target = str(OmegaConf.select(config, "checker._target_"))
        names = {getattr(schemas, checker_schema(n))._target_: n for n in checker_groups()}
        return names.get(target, target)
    value = OmegaConf.select(config, group)
    return "null" if value is None else str(getattr(value, "value", value))


def check_key_uses(mode: str, config: Any, overrides: Iterable[str]) -> None:
    """Check that every key the user set is used by the options chosen with it: a mode's keys dataclass
    names in its ``used_with`` (a ``ClassVar``) the keys that only some options of another key use
    (``tie_blocks`` only ``marker=minimal``, ``calibration`` only ``low_precision=int8``), and in its
    ``not_with`` the keys another one replaces (``quantized_model`` brings its own ``low_precision``).

    Args:
        mode: the mode's name. config: the composed config. overrides: the user's overrides.

    Raises:
        ConfigError: the one "not used by" line (``not_used``), naming the key as typed
            (``calibration.cache``) and the options that use it.
    """
    used_with: Dict[str, Any] = getattr(mode_keys()[mode], "used_with", {})
    not_with: Dict[str, Any] = getattr(mode_keys()[mode], "not_with", {})
    overrides = list(overrides)
    given = set_keys(overrides)
    for key, others in not_with.items():
        for other in (o for o in others if key in given and o in given):
            sub = _keys_after(f"{other}.", overrides)
            raise ConfigError(
                f"{other}{'.' + sub[0] if sub else ''}= is not used with {key}= (it brings its own); drop it"
            )
    for key in given:
        if key not in used_with:
            continue
        group, users = used_with[key]
        option = chosen(config, group)
        if option not in users:
            sub = _keys_after(f"{key}.", overrides)
            raise ConfigError(not_used(f"{key}.{sub[0]}" if sub else key, group, option, users))


#: fields of a mode's keys that the run builds and passes to ``create`` itself (``None`` in ``keys_of``)
BUILT = ("checker", "executor", "marker")


def keys_of(mode: str, cfg: Any) -> Any:
    """The mode's keys (its ``KEYS`` dataclass) filled from the run's config: what its ``create`` takes
    whole. Values are resolved and checked against the schema; enums stay enums, nested schemas
    (``calibration``) are their dataclasses, lists are lists; the ``BUILT`` fields are None.

    Args:
        mode: the mode's name.
        cfg: the run's config (a ``DictConfig``, or a mapping in tests).

    Raises:
        ConfigError: a value the schema refuses (a wrong type or enum member).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    cls = mode_keys()[mode]
    names = [n for n in _names(cls) if n not in BUILT]
    given: Dict[str, Any] = {}
    for name in names:
        if name in cfg:
            value = OmegaConf.select(cfg, name) if OmegaConf.is_config(cfg) else cfg[name]
            given[name] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    try:
        node = OmegaConf.merge(OmegaConf.structured(cls), given)
    except ValidationError as e:
        raise ConfigError(f"mode={mode}: {first_line(e)}") from None
    picked = {n: OmegaConf.select(node, n) for n in names}
    values = {n: OmegaConf.to_object(v) if OmegaConf.is_config(v) else v for n, v in picked.items()}
    return cls(**values, **dict.fromkeys(n for n in BUILT if n in _names(cls)))


#: a short random id, fixed for this process (``${run_id:}`` in the default run and sweep directories):
#: two processes started in the same microsecond still differ (``runner.files.rundir``)
RUN_ID = secrets.token_hex(2)


def _help() -> str:
    """``python -m runner KEY=VALUE --help``'s text above the composed config: the same generated
    help as ``--help`` alone (``runner.terminal.help``), as the ``${runner_help:}`` resolver that
    ``conf/config.yaml``'s help template holds."""
    from runner.terminal.help import render

    return render()


@functools.cache
def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore, once per process (a run through the API composes its
    config each time; storing the schemas again would cost 20 ms a run).

    The group YAML files extend these through their defaults lists, e.g.
    ``conf/checker/command.yaml`` starts with ``defaults: [command_schema]``.
    """
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("run_id", lambda: RUN_ID, replace=True)
    OmegaConf.register_new_resolver("runner_help", _help, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=run_config())
    cs.store(name="mode_schema", node=ModeConf)
    cs.store(name="marker_schema", node=MarkerConf)
    for checker in checker_groups():  # conf/checker is the one list; each schema named by one rule
        cs.store(name=f"{checker}_schema", node=getattr(config, checker_schema(checker)))
    cs.store(name="artifacts_schema", node=ArtifactsConf)
    for path in plugin_mode_files():  # modes of other packages (conf.MODE_ENTRY_POINTS) join conf/mode's
        cs.store(group="mode", name=path.stem, node=OmegaConf.load(path))
    for executor in executor_groups():  # conf/executor is the one list, as for checkers
        cs.store(name=f"{executor}_executor_schema", node=getattr(config, executor_schema(executor)))
