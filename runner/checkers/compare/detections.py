"""Judge a detector by its detections: boxes matched by IoU, the scores and labels of matched boxes
compared, unmatched boxes counted (``checker.detections``).

A detector's outputs after NMS are decisions: one score a hair over the threshold adds a box, and
the arrays then differ in length, which an array comparison can only call a failure. A user of a
detector asks instead whether the same objects are found: here each golden box (highest score
first) is matched to the candidate's unmatched box of the same label with the highest IoU, if that
IoU reaches ``iou``; a golden box without a match, or a candidate box no golden box took, is
unmatched. Boxes scored under ``min_score`` on both sides are left out (their flips are below the
threshold a deployment uses). The candidate passes when at most ``max_unmatched`` boxes are
unmatched and every matched pair's scores differ by at most ``score_atol`` (the matching is the
greedy one of the COCO and PASCAL VOC evaluations).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from runner.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DetectionRule:
    """How detections are judged.

    Attributes:
        boxes: the tensor of boxes, ``[..., N, 4]`` as (x1, y1, x2, y2).
        scores: the tensor of their scores, ``[..., N]``.
        labels: the tensor of their labels, ``[..., N]``, or None (every box one class).
        iou: the IoU (0 to 1] at which two boxes are the same detection.
        score_atol: the largest score difference of a matched pair.
        min_score: boxes under this score on both sides are left out.
        max_unmatched: unmatched boxes allowed (golden boxes missed plus candidate boxes extra).

    Raises:
        ConfigError: a missing tensor name or a bound outside its range.
    """

    boxes: str
    scores: str
    labels: Optional[str] = None
    iou: float = 0.5
    score_atol: float = 0.05
    min_score: float = 0.0
    max_unmatched: int = 0

    def __post_init__(self) -> None:
        if not self.boxes or not self.scores:
            raise ConfigError(
                "checker.detections needs boxes= and scores= tensor names, e.g. "
                "'checker.detections={boxes: boxes, scores: scores, labels: labels}'"
            )
        if not 0 < self.iou <= 1:
            raise ConfigError(f"checker.detections.iou={self.iou}: give an IoU in (0, 1], e.g. 0.5")
        if self.score_atol < 0 or self.max_unmatched < 0:
            raise ConfigError("checker.detections.score_atol and max_unmatched must be 0 or more")

    @classmethod
    def from_config(cls, spec: Optional[Mapping[str, Any]]) -> Optional[DetectionRule]:
        """The rule from ``checker.detections`` (a map), or None when it is not set.

        Raises:
            ConfigError: an unknown key, or bad values (see the class).
        """
        if not spec:
            return None
        example = "'checker.detections={boxes: boxes, scores: scores, labels: labels}'"
        if not isinstance(spec, Mapping):
            raise ConfigError(f"checker.detections={spec!r} is no map of tensor names; write it as {example}")
        known = {"boxes", "scores", "labels", "iou", "score_atol", "min_score", "max_unmatched"}
        unknown = sorted(set(map(str, spec)) - known)
        if unknown:
            raise ConfigError(f"checker.detections has unknown keys {unknown}; use {sorted(known)}")
        missing = [k for k in ("boxes", "scores") if not spec.get(k)]
        if missing:
            raise ConfigError(f"checker.detections has no {' or '.join(missing)}= tensor name; write it as {example}")
        values: Dict[str, Any] = {k: str(spec[k]) for k in ("boxes", "scores", "labels") if spec.get(k) is not None}
        for key, kind in (("iou", float), ("score_atol", float), ("min_score", float), ("max_unmatched", int)):
            if key in spec:
                try:
                    values[key] = kind(spec[key])
                except (TypeError, ValueError):
                    raise ConfigError(
                        f"checker.detections.{key}={spec[key]!r} is not a number; give a {kind.__name__}"
                    ) from None
                if values[key] != values[key]:  # NaN
                    raise ConfigError(f"checker.detections.{key}={spec[key]!r} is not a number; give a {kind.__name__}")
        return cls(**values)

    def check_shapes(self, golden: Mapping[str, np.ndarray]) -> None:
        """Refuse tensors whose golden values cannot be boxes and scores (``[..., N, 4]`` and ``[..., N]``).

        Raises:
            ConfigError: the boxes tensor's last axis is not 4, or the scores are not one per box: the
                names swapped, or tensors that are no detections.
        """
        boxes = np.asarray(golden[self.boxes])
        scores = np.asarray(golden[self.scores])
        if boxes.ndim < 1 or boxes.shape[-1] != 4 or scores.size * 4 != boxes.size:
            raise ConfigError(
                f"checker.detections: boxes={self.boxes} has shape {list(boxes.shape)} and scores={self.scores} "
                f"{list(scores.shape)}, where boxes are [..., N, 4] and scores [..., N]; are the two names swapped?"
            )

    def tensors(self) -> List[str]:
        """The tensors the rule reads."""
        return [t for t in (self.boxes, self.scores, self.labels) if t]


def _flat(values: np.ndarray, width: int) -> np.ndarray:
    """``values`` with leading axes of size 1 dropped: ``[N, width]`` (boxes) or ``[N]``."""
    a = np.asarray(values, dtype=np.float64)
    while a.ndim > (2 if width else 1) and a.shape[0] == 1:
        a = a[0]
    return a.reshape(-1, width) if width else a.reshape(-1)


def _area(boxes: np.ndarray) -> np.ndarray:
    """The area of each box of ``boxes`` ``[N, 4]`` (x1, y1, x2, y2), 0 for an inverted one."""
    return np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` ``[N, 4]`` with every box of ``b`` ``[M, 4]`` (x1, y1, x2, y2): ``[N, M]``.
    A box with a coordinate that is not finite (an fp16 overflow) has IoU 0 with every box."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # inf - inf: NaN, then IoU 0
        x1 = np.maximum(a[:, None, 0], b[None, :, 0])
        y1 = np.maximum(a[:, None, 1], b[None, :, 1])
        x2 = np.minimum(a[:, None, 2], b[None, :, 2])
        y2 = np.minimum(a[:, None, 3], b[None, :, 3])
        inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
        union = _area(a)[:, None] + _area(b)[None, :] - inter
        iou = np.where(union > 0, inter / union, 0.0)
    return np.where(np.isfinite(iou), iou, 0.0)


def judge(
    got: Mapping[str, np.ndarray], golden: Mapping[str, np.ndarray], rule: DetectionRule
) -> Tuple[bool, Dict[str, Any], str]:
    """Match the candidate's detections with the golden ones.

    Returns:
        (passed; facts: ``golden``, ``candidate`` (boxes kept), ``matched``, ``missed``, ``extra``,
        ``max_score_diff``, ``min_iou``; the problem in words, "" when it passes).
    """
    sides = []
    for values in (golden, got):
        boxes, scores = _flat(values[rule.boxes], 4), _flat(values[rule.scores], 0)
        labels = _flat(values[rule.labels], 0) if rule.labels else np.zeros(len(scores))
        n = min(len(boxes), len(scores), len(labels))
        sides.append((boxes[:n], scores[:n], labels[:n]))
    (gb, gs, gl), (cb, cs, cl) = sides
    keep_g = gs >= rule.min_score
    keep_c = cs >= rule.min_score
    ious = iou_matrix(gb, cb) if len(gb) and len(cb) else np.zeros((len(gb), len(cb)))
    taken = np.zeros(len(cb), bool)
    matched: List[Tuple[int, int]] = []
    for g in np.argsort(-gs, kind="stable"):
        candidates = [c for c in range(len(cb)) if not taken[c] and cl[c] == gl[g] and ious[g, c] >= rule.iou]
        if not candidates:
            continue
        c = max(candidates, key=lambda c: ious[g, c])
        taken[c] = True
        matched.append((int(g), c))
    pair_g = {g for g, _ in matched}
    missed = sum(1 for g in range(len(gb)) if keep_g[g] and g not in pair_g)
    extra = sum(1 for c in range(len(cb)) if keep_c[c] and not taken[c])
    counted = [(g, c) for g, c in matched if keep_g[g] or keep_c[c]]
    diffs = [abs(float(gs[g] - cs[c])) for g, c in counted]
    facts = {
        "golden": int(keep_g.sum()),
        "candidate": int(keep_c.sum()),
        "matched": len(counted),
        "missed": missed,
        "extra": extra,
        "max_score_diff": max(diffs, default=0.0),
        "min_iou": min((float(ious[g, c]) for g, c in counted), default=1.0),
    }
    problems = []
    if missed + extra > rule.max_unmatched:
        problems.append(
            f"{missed} golden box(es) unmatched and {extra} extra "
            f"(IoU >= {rule.iou}, max_unmatched={rule.max_unmatched})"
        )
    if facts["max_score_diff"] > rule.score_atol:
        problems.append(
            f"a matched box's score differs by {facts['max_score_diff']:.3g} > score_atol={rule.score_atol}"
        )
    return not problems, facts, "; ".join(problems)


def judge_logged(
    got: Mapping[str, np.ndarray], golden: Mapping[str, np.ndarray], rule: DetectionRule, where: str
) -> Optional[Tuple[bool, Dict[str, Any], str]]:
    """``judge``, logged on one line prefixed by ``where``, when ``got`` holds every detection tensor;
    None when the candidate does not compute them all (a subgraph)."""
    if not all(t in got for t in rule.tensors()):
        return None
    passed, facts, problem = judge(got, golden, rule)
    log.info(
        "%s: detections: %d golden, %d matched, %d missed, %d extra, max score diff %.3g, min IoU %.3f",
        where,
        facts["golden"],
        facts["matched"],
        facts["missed"],
        facts["extra"],
        facts["max_score_diff"],
        facts["min_iou"],
    )
    return passed, facts, problem
