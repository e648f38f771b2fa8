"""What a ``polygraphy run`` check command compares: the tensors of its ``--load-outputs`` file.

Polygraphy's debug README reduces a model against golden values of every tensor of the good model
(``polygraphy run good.onnx --onnx-outputs mark all --save-outputs golden.json``), with the check
``polygraphy run {artifact} --onnxrt --load-inputs all_inputs.json --load-outputs golden.json`` at its
default tolerance (1e-5). Such golden values were computed with every tensor an output, so ONNX Runtime
fused nothing across them; a candidate that outputs only its boundary tensors lets ONNX Runtime fuse and
re-lay out its inside (Conv with BatchNormalization and activations, NCHWc kernels), and its values
differ from the golden ones by fp32 rounding, 2e-5 on the bundled classifier: failures that are no
fault. Reduce reads the file (with Polygraphy's own JSON reader) to make each candidate output every
tensor it computes that the file holds, so that it is computed as the full model's run computed it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, List, Optional, Tuple

log = logging.getLogger(__name__)

#: the options of ``polygraphy run`` naming the file of golden outputs
LOAD_OUTPUTS = ("--load-outputs", "--load-results")


def polygraphy_run_outputs(argv: List[str], cwd: Optional[Path] = None) -> Optional[Tuple[str, ...]]:
    """The tensor names the ``--load-outputs`` file of a ``polygraphy run`` command holds.

    Args:
        argv: the check command's words (``shlex.split`` of ``checker.cmd``).
        cwd: where the command runs (its relative paths); None: this process's working directory.

    Returns:
        The names (every runner's first iteration, in the file's order), or None when the command is no
        ``polygraphy run`` with such a file, polygraphy is not installed, or the file cannot be read (the
        check says so when it runs).
    """
    names = [Path(word).name for word in argv]
    if "polygraphy" not in names or "run" not in names[names.index("polygraphy") + 1 :]:
        return None
    path: Optional[str] = None
    for i, word in enumerate(argv):
        for option in LOAD_OUTPUTS:
            if word == option and i + 1 < len(argv):
                path = argv[i + 1]
            elif word.startswith(option + "="):
                path = word.split("=", 1)[1]
    if path is None:
        return None
    file = Path(path) if Path(path).is_absolute() or cwd is None else cwd / path
    try:
        from polygraphy.comparator import RunResults
        from polygraphy.logger import G_LOGGER
    except ImportError:
        return None
    try:
        with G_LOGGER.verbosity(G_LOGGER.ERROR):
            results = RunResults.load(str(file))
    except Exception as e:  # the check itself reports a file it cannot read
        log.debug("Cannot read %s as Polygraphy run results (%s)", file, e)
        return None
    tensors: Dict[str, None] = {}  # in the file's order: Polygraphy's matching takes the first name that fits
    for _, iterations in results.items():
        if iterations:
            tensors.update(dict.fromkeys(iterations[0].keys()))
    return tuple(tensors)
