"""Real input for the bundled OCR models, and the checks a user of them would write.

Pages and lines of text are rendered with Pillow's bundled font (no download), normalized as
PaddleOCR feeds its models, and are deterministic: sample ``k`` is always the same image.

- ``detector_pages``: ``data_loader=`` for ``ch_PP-OCRv4_det_infer.onnx``: 4 pages, 320x320.
- ``classifier_lines``: ``data_loader=`` for ``ch_ppocr_mobile_v2.0_cls_infer.onnx``: 8 lines,
  48x192, half of them upside down.
- ``text_map_iou``: ``checker=python``: the candidate's text-probability map, thresholded at 0.3
  as PaddleOCR's DB post-processing does, overlaps the fp32 model's by IoU >= 0.9 on every page.
- ``same_labels``: ``checker=python``: the candidate classifies every line as the fp32 model does.

Usage (from the repository root, so ``examples`` imports)::

    python -m runner mode=precision low_precision=int8 marker=minimal \\
        model=examples/ch_PP-OCRv4_det_infer.onnx data_loader=examples.text_pages.detector_pages \\
        checker=python checker.target=examples.text_pages.text_map_iou \\
        'checker.args=[examples/ch_PP-OCRv4_det_infer.onnx]'
"""

from __future__ import annotations

import functools
from typing import Dict, Iterator, List, Tuple

import numpy as np
import onnxruntime as ort
from PIL import Image, ImageDraw, ImageFont

#: PaddleOCR's normalization (ImageNet mean and std on 0-1 pixels) for the detector
MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
WORDS = [
    "invoice",
    "total",
    "amount",
    "date",
    "name",
    "address",
    "ONNX",
    "TensorRT",
    "layer",
    "node",
    "tensor",
    "precision",
    "int8",
    "calibration",
    "2026",
    "No.",
    "42",
    "receipt",
    "paid",
    "due",
    "order",
]


def _page(seed: int, size: int) -> Image.Image:
    """A page of left-aligned text lines of random words, sizes and inks on a light background."""
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (size, size), tuple(int(v) for v in rng.integers(200, 256, 3)))
    draw = ImageDraw.Draw(img)
    y = 8
    while y < size - 28:
        px = int(rng.integers(14, 30))
        text = " ".join(str(w) for w in rng.choice(WORDS, int(rng.integers(2, 5))))
        ink = tuple(int(v) for v in rng.integers(0, 80, 3))
        draw.text((int(rng.integers(4, 60)), y), text, fill=ink, font=ImageFont.load_default(size=px))
        y += px + int(rng.integers(6, 20))
    return img


def page_input(seed: int, size: int = 320) -> np.ndarray:
    """Page ``seed`` as the detector's input: float32 [1, 3, size, size], normalized."""
    x = (np.asarray(_page(seed, size), np.float32) / 255.0 - MEAN) / STD
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def line_input(seed: int, flipped: bool) -> np.ndarray:
    """A line of text as the classifier's input: float32 [1, 3, 48, 192] in [-1, 1], rotated 180
    degrees when ``flipped``."""
    rng = np.random.default_rng(1000 + seed)
    img = Image.new("RGB", (192, 48), (255, 255, 255))
    text = " ".join(str(w) for w in rng.choice(WORDS, 2))
    ImageDraw.Draw(img).text((4, 8), text, fill=(0, 0, 0), font=ImageFont.load_default(size=26))
    if flipped:
        img = img.rotate(180)
    x = np.asarray(img, np.float32) / 255.0
    return ((x - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)


def detector_pages(count: int = 4) -> Iterator[Dict[str, np.ndarray]]:
    """``count`` rendered pages, one feed dict ``{"x": [1, 3, 320, 320]}`` each."""
    for k in range(count):
        yield {"x": page_input(k)}


def classifier_lines(count: int = 8) -> Iterator[Dict[str, np.ndarray]]:
    """``count`` rendered lines, every second one upside down, one feed dict each."""
    for k in range(count):
        yield {"x": line_input(k, flipped=k % 2 == 1)}


def _outputs(path: str, feeds: List[Dict[str, np.ndarray]]) -> List[np.ndarray]:
    """The first output of the model at ``path`` (a new session: a candidate's file may be rewritten
    in place between checks) on each feed dict."""
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return [session.run(None, f)[0] for f in feeds]


@functools.lru_cache(maxsize=4)
def _reference(path: str, kind: str) -> Tuple[np.ndarray, ...]:
    feeds = list(detector_pages() if kind == "pages" else classifier_lines())
    return tuple(_outputs(path, feeds))


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two boolean masks (1.0 when both are empty)."""
    union = np.count_nonzero(a | b)
    return 1.0 if union == 0 else np.count_nonzero(a & b) / union


def text_map_iou(candidate: str, reference: str, threshold: str = "0.3", min_iou: str = "0.9") -> bool:
    """Whether the candidate's text map, thresholded, overlaps the reference model's by ``min_iou``
    on every page of ``detector_pages``.

    Args:
        candidate: the candidate model's path (the python checker passes it).
        reference: the fp32 model's path (``checker.args``).
        threshold: the probability above which a pixel is text (PaddleOCR's ``thresh``, 0.3).
        min_iou: the smallest IoU that passes.

    Returns:
        True when every page passes.
    """
    feeds = list(detector_pages())
    golden = _reference(reference, "pages")
    got = _outputs(candidate, feeds)
    t = float(threshold)
    return all(iou(g > t, r > t) >= float(min_iou) for g, r in zip(got, golden))


def same_labels(candidate: str, reference: str) -> bool:
    """Whether the candidate classifies every line of ``classifier_lines`` (upright or upside down)
    as the reference model does."""
    feeds = list(classifier_lines())
    golden = _reference(reference, "lines")
    got = _outputs(candidate, feeds)
    return all(int(np.argmax(g)) == int(np.argmax(r)) for g, r in zip(got, golden))
