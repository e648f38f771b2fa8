"""``builder.*``: TensorRT builder settings for ``mode=build`` (Polygraphy's ``debug build`` options).

The keys are checked here without TensorRT (``check_builder_options``: a misspelt name is one line before
anything else), and set on each build's ``IBuilderConfig`` with it (``apply_builder_options``); a setting the
installed TensorRT does not have is one line naming it and the version.

- ``builder.optimization_level=N`` (``--builder-optimization-level``): ``builder_optimization_level``, 0-5;
- ``builder.tf32=true|false`` (``--tf32``): ``BuilderFlag.TF32`` set or cleared;
- ``builder.flags=[...]``: the ``BuilderFlag`` of each (``FLAGS``: ``--sparse-weights``, ``--refittable``,
  ``--version-compatible``, ``--exclude-lean-runtime``, ``--strip-plan``, ``--direct-io``,
  ``--disable-compilation-cache``, ``--error-on-timing-cache-miss``, ``--weight-streaming``, ``--allow-gpu-fallback``);
- ``builder.hardware_compatibility_level=``, ``builder.profiling_verbosity=``, ``builder.tiling_optimization_level=``,
  ``builder.runtime_platform=``: the member of TensorRT's enum of that name (``CHOICES``);
- ``builder.max_aux_streams=N`` (``--max-aux-streams``); ``builder.tactic_sources=[...]`` (``--tactic-sources``:
  only these); ``builder.preview_features=[...]`` (``--preview-features``: enabled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional

from runner.errors import ConfigError

if TYPE_CHECKING:  # the stubs check the builder config's attribute names; TensorRT itself is optional
    import tensorrt

#: ``builder.flags`` names and the ``BuilderFlag`` each sets (Polygraphy's option in the docstring above)
FLAGS: Dict[str, str] = {
    "sparse_weights": "SPARSE_WEIGHTS",
    "refittable": "REFIT",
    "version_compatible": "VERSION_COMPATIBLE",
    "exclude_lean_runtime": "EXCLUDE_LEAN_RUNTIME",
    "strip_plan": "STRIP_PLAN",
    "direct_io": "DIRECT_IO",
    "disable_compilation_cache": "DISABLE_COMPILATION_CACHE",
    "error_on_timing_cache_miss": "ERROR_ON_TIMING_CACHE_MISS",
    "weight_streaming": "WEIGHT_STREAMING",
    "gpu_fallback": "GPU_FALLBACK",
}
#: the names each enum-valued key takes (lowercase TensorRT member names)
CHOICES: Dict[str, List[str]] = {
    "hardware_compatibility_level": ["none", "ampere_plus", "same_compute_capability"],
    "tactic_sources": ["cublas", "cublas_lt", "cudnn", "edge_mask_convolutions", "jit_convolutions"],
    "profiling_verbosity": ["layer_names_only", "detailed", "none"],
    "tiling_optimization_level": ["none", "fast", "moderate", "full"],
    "runtime_platform": ["same_as_build", "windows_amd64"],
}


def _names(key: str, values: Iterable[str], known: Iterable[str]) -> List[str]:
    """``values`` lowercased, each one of ``known``.

    Raises:
        ConfigError: one that is not, naming the key and the choices.
    """
    known = list(known)
    out = [str(v).lower() for v in values]
    wrong = [v for v in out if v not in known]
    if wrong:
        raise ConfigError(f"builder.{key}={wrong[0]}: give one of {', '.join(known)}")
    return out


def check_builder_options(conf: Any) -> Dict[str, Any]:
    """The ``builder.*`` keys that are set, checked: ``{key: value}`` with names lowercased.

    Args:
        conf: ``BuildKeys.builder`` (``runner.config.BuilderConf``).

    Raises:
        ConfigError: a level outside 0-5, a negative stream count, a name TensorRT has no such setting for.
    """
    found: Dict[str, Any] = {}
    level = conf.optimization_level
    if level is not None:
        if not 0 <= int(level) <= 5:
            raise ConfigError(f"builder.optimization_level={level}: give 0 to 5 (TensorRT's default is 3)")
        found["optimization_level"] = int(level)
    if conf.tf32 is not None:
        found["tf32"] = bool(conf.tf32)
    if conf.flags:
        found["flags"] = _names("flags", conf.flags, FLAGS)
    if conf.max_aux_streams is not None:
        if int(conf.max_aux_streams) < 0:
            raise ConfigError(f"builder.max_aux_streams={conf.max_aux_streams}: give 0 or more (0: one stream)")
        found["max_aux_streams"] = int(conf.max_aux_streams)
    for key in ("hardware_compatibility_level", "profiling_verbosity", "tiling_optimization_level", "runtime_platform"):
        value = getattr(conf, key)
        if value is not None:
            found[key] = _names(key, [value], CHOICES[key])[0]
    if conf.tactic_sources is not None:
        found["tactic_sources"] = _names("tactic_sources", conf.tactic_sources, CHOICES["tactic_sources"])
    if conf.preview_features:
        found["preview_features"] = [str(f).lower() for f in conf.preview_features]
    return found


def _member(trt: Any, enum: str, name: str, key: str) -> Any:
    """``trt.<enum>.<NAME>``.

    Raises:
        ConfigError: the installed TensorRT has no such member (an older or newer version).
    """
    member = getattr(getattr(trt, enum, None), name.upper(), None)
    if member is None:
        raise ConfigError(
            f"builder.{key}={name}: TensorRT {trt.__version__} has no {enum}.{name.upper()}; drop it or use a "
            "TensorRT that has it"
        )
    return member


def apply_builder_options(config: tensorrt.IBuilderConfig, options: Dict[str, Any], trt: Optional[Any] = None) -> None:
    """Set ``options`` (``check_builder_options``'s) on a TensorRT ``IBuilderConfig``.

    Args:
        config: the build's ``trt.IBuilderConfig``.
        options: the checked keys.
        trt: the ``tensorrt`` module (imported here when None).

    Raises:
        ConfigError: the installed TensorRT lacks a setting asked for.
    """
    if trt is None:
        import tensorrt as trt
    if "optimization_level" in options:
        config.builder_optimization_level = options["optimization_level"]
    if "tf32" in options:
        flag = _member(trt, "BuilderFlag", "TF32", "tf32")
        if options["tf32"]:
            config.set_flag(flag)
        else:
            config.clear_flag(flag)
    for name in options.get("flags", []):
        config.set_flag(_member(trt, "BuilderFlag", FLAGS[name], "flags"))
    if "max_aux_streams" in options:
        config.max_aux_streams = options["max_aux_streams"]
    enums = {
        "hardware_compatibility_level": "HardwareCompatibilityLevel",
        "profiling_verbosity": "ProfilingVerbosity",
        "tiling_optimization_level": "TilingOptimizationLevel",
        "runtime_platform": "RuntimePlatform",
    }
    for key, enum in enums.items():
        if key in options:
            setattr(config, key, _member(trt, enum, options[key], key))
    if "tactic_sources" in options:
        mask = 0
        for name in options["tactic_sources"]:
            mask |= 1 << int(_member(trt, "TacticSource", name, "tactic_sources"))
        config.set_tactic_sources(mask)
    for name in options.get("preview_features", []):
        config.set_preview_feature(_member(trt, "PreviewFeature", name, "preview_features"), True)
