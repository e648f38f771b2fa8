"""A Qwen2-shaped decoder of any size with a planted fp16 fault, written straight to ONNX with external data: the
benchmark model of issue 75 (Qwen2-7B's shape: 28 layers, hidden 3584, 28 query and 4 key-value heads, MLP 18944,
vocabulary 152064; about 7.6B parameters, 30 GB of fp32 weights) made in about a minute where torch.onnx's export
of it needs the model twice in memory and many minutes.

Each weight is drawn, applied to a reference forward pass of the token ids in NumPy (fp32, a few tokens: cheap
beside the drawing), then appended to the data file and dropped; memory holds one matrix at a time. The forward
pass is what plants the fault as measured, not guessed (as ``benchmarks/qwen_on_gpu.py`` measures with torch):

- ``attention``: in every layer one rotary dimension of each query and key head holds a power of 2 (its weights
  zero, its bias the value) so that every score of a row carries one offset of about ``--logit-peak`` (1e6: past
  fp16's 65504), as the massive activations of trained decoders do: softmax, shift-invariant, gives what it gives
  without it, fp16 overflows, so each layer's score MatMul, scale Mul, mask Add and Softmax must stay in fp32
  (4 nodes a layer), and nothing else (that rotary pair has frequency 0, as a partial rotary embedding leaves
  some dimensions unturned: fp16 queries and keys carry the offset exactly). Scaling q_proj and k_proj instead
  makes attention hard (one key per row), and fp16's rounding anywhere then picks other keys: 28 layers of it
  moved the logits by rel L2 0.14 with 1,738 of 1,888 nodes kept;
- ``norm``: the last MLP's down_proj scaled so that the final RMSNorm's input peaks at ``--peak`` (2000: within
  fp16, while its square is not), so that norm's Pow, ReduceMean, Add and Sqrt must stay in fp32 (4 nodes).

The graph is torch.onnx's export of a Qwen2 layer as ``examples.planted.attention_decoder`` writes it (RMSNorm with
its Casts to fp32, q/k/v projections with biases, rotary embedding, grouped key-value heads repeated with
Unsqueeze, Expand and Reshape as ``repeat_kv`` exports, a gated SiLU MLP), at opset 17, fed ``--seq`` token ids.

Usage: python benchmarks/planted_decoder.py OUT_DIR [--preset 7b|2b|0.5b|tiny] [--fault attention|norm] [...]
Writes OUT_DIR/decoder.onnx, its data file decoder.onnx.data, ids.npz and needed.json (the nodes that must stay).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: Qwen2's shapes: (layers, hidden, intermediate, heads, kv heads, vocabulary)
PRESETS: Dict[str, Tuple[int, int, int, int, int, int]] = {
    "7b": (28, 3584, 18944, 28, 4, 152064),
    "2b": (4, 3584, 18944, 28, 4, 152064),  # issue 75's probe: 7B's width, 4 layers
    "0.5b": (24, 896, 4864, 14, 2, 151936),
    "tiny": (2, 64, 128, 4, 2, 96),
}


class DataFile:
    """The external data file the weights are appended to, each at an offset aligned to 4 KB (mappable)."""

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "wb")  # noqa: SIM115 (closed by ``close``)
        self.offset = 0

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        """Append ``array`` and return its initializer, pointing at it."""
        pad = -self.offset % 4096
        if pad:
            self.file.write(b"\0" * pad)
            self.offset += pad
        data = np.ascontiguousarray(array).tobytes()
        self.file.write(data)
        tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(self.offset)), ("length", str(len(data)))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.offset += len(data)
        return tensor

    def close(self) -> None:
        self.file.close()


def _rms(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * weight


def _rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    turned = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + turned * sin


def write_decoder(
    out: Path,
    layers: int,
    hidden: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    seq: int = 8,
    fault: str = "attention",
    logit_peak: float = 1e6,
    peak: float = 2000.0,
    seed: int = 0,
) -> Dict[str, Any]:
    """Write the decoder (module docstring) into ``out``.

    Args:
        out: an existing folder.
        layers, hidden, intermediate, heads, kv_heads, vocab: the shape (``PRESETS``).
        seq: token ids fed.
        fault: ``attention`` or ``norm``.
        logit_peak: the largest raw score q.k of each layer with ``attention``.
        peak: the final RMSNorm's largest input with ``norm``.
        seed: of the weights and the ids.

    Returns:
        ``{"model", "inputs", "needed", "parameters", "weight_bytes", "seconds"}``: paths as strings, the node
        names that must stay in fp32, counts.

    Raises:
        ValueError: a shape that does not divide (heads by kv_heads, hidden by heads), an unknown fault.
    """
    if hidden % heads or heads % kv_heads or fault not in ("attention", "norm"):
        raise ValueError(f"hidden {hidden}, heads {heads}, kv_heads {kv_heads}, fault {fault}: no such decoder")
    began = time.monotonic()
    rng = np.random.default_rng(seed)
    head, groups = hidden // heads, heads // kv_heads
    ids = rng.integers(0, vocab, (1, seq)).astype(np.int64)
    data = DataFile(out / "decoder.onnx.data")
    inits: List[TensorProto] = []
    nodes: List[onnx.NodeProto] = []
    parameters = 0

    def weight(name: str, array: np.ndarray) -> str:
        nonlocal parameters
        parameters += array.size
        inits.append(data.tensor(name, array.astype(np.float32, copy=False)))
        return name

    def small(name: str, array: Any) -> str:
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(op: str, inputs: Sequence[str], name: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, list(inputs), [name], name=name, **attrs))
        return name

    def draw(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(gain / np.sqrt(rows))

    half = head // 2
    # the attention fault's q and k value in the last rotary pair, which turns with no position (a turn multiplies
    # the offset's 1e6 by cos(theta) < 1 in fp32, a difference fp16 cannot hold): a power of 2 whose square over
    # sqrt(head) reaches logit_peak
    offset = np.float32(2.0 ** np.ceil(np.log2(np.sqrt(logit_peak * np.sqrt(head)))))
    inv_freq = 1.0 / (10000 ** (np.arange(0, half) / half))
    if fault == "attention":  # the offset's pair turns with no position (cos 1, sin 0): its product is exact
        inv_freq[half - 1] = 0.0
    angles = np.outer(np.arange(seq), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1).astype(np.float32)
    cos, sin = np.cos(angles)[None, None], np.sin(angles)[None, None]
    mask = np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), 1)[None, None]
    for name, value in (
        ("two", np.float32(2.0)),
        ("eps", np.float32(1e-6)),
        ("cos", cos),
        ("sin", sin),
        ("mask", mask),
        ("scale", np.float32(1.0 / np.sqrt(head))),
    ):
        small(name, value)
    for name, value in (
        ("split_q", [1, seq, heads, head]),
        ("split_kv", [1, seq, kv_heads, head]),
        ("expand_kv", [1, kv_heads, groups, seq, head]),
        ("merge_kv", [1, heads, seq, head]),
        ("merge_heads", [1, seq, hidden]),
        ("zero", [0]),
        ("half", [half]),
        ("head", [head]),
        ("last_axis", [3]),
        ("kv_axis", [2]),
    ):
        small(name, np.array(value, np.int64))

    emb = rng.standard_normal((vocab, hidden), dtype=np.float32)
    h_ref = emb[ids[0]][None]  # [1, seq, hidden]
    weight("embed_tokens.weight", emb)
    del emb
    h = node("Gather", ["embed_tokens.weight", "ids"], "embed_tokens")

    def rmsnorm(prefix: str, x: str, x_ref: np.ndarray) -> Tuple[str, np.ndarray]:
        w = (1 + 0.1 * rng.standard_normal(hidden, dtype=np.float32)).astype(np.float32)
        weight(f"{prefix}.weight", w)
        x = node("Cast", [x], f"{prefix}.cast", to=TensorProto.FLOAT)
        sq = node("Pow", [x, "two"], f"{prefix}.pow")
        mean = node("ReduceMean", [sq], f"{prefix}.mean", axes=[-1])
        inv = node(
            "Reciprocal",
            [node("Sqrt", [node("Add", [mean, "eps"], f"{prefix}.add_eps")], f"{prefix}.sqrt")],
            f"{prefix}.reciprocal",
        )
        normed = node("Cast", [node("Mul", [x, inv], f"{prefix}.mul")], f"{prefix}.cast_back", to=TensorProto.FLOAT)
        return node("Mul", [normed, f"{prefix}.weight"], f"{prefix}.mul_weight"), _rms(x_ref, w)

    def linear(prefix: str, x: str, matrix: np.ndarray, bias: Optional[Any] = None) -> str:
        y = node("MatMul", [x, weight(f"{prefix}.weight", matrix)], f"{prefix}.matmul")
        if bias is not None:
            y = node("Add", [y, weight(f"{prefix}.bias", bias)], f"{prefix}.add_bias")
        return y

    def rotary(prefix: str, x: str) -> str:
        first = node("Slice", [x, "zero", "half", "last_axis"], f"{prefix}.slice_first")
        second = node("Slice", [x, "half", "head", "last_axis"], f"{prefix}.slice_second")
        turned = node("Concat", [node("Neg", [second], f"{prefix}.neg"), first], f"{prefix}.rotate_half", axis=-1)
        return node(
            "Add",
            [node("Mul", [x, "cos"], f"{prefix}.mul_cos"), node("Mul", [turned, "sin"], f"{prefix}.mul_sin")],
            f"{prefix}.add",
        )

    needed: List[str] = []
    for i in range(layers):
        p = f"layers.{i}"
        n, n_ref = rmsnorm(f"{p}.input_layernorm", h, h_ref)
        wq, wk, wv = draw(hidden, hidden), draw(hidden, kv_heads * head), draw(hidden, kv_heads * head)
        bq, bk, bv = (np.float32(0.02) * rng.standard_normal(w.shape[1], dtype=np.float32) for w in (wq, wk, wv))
        if fault == "attention":  # every score of a row gets one offset: softmax is the same, fp16 overflows
            for w, b, count in ((wq, bq, heads), (wk, bk, kv_heads)):
                cols = [h * head + half - 1 for h in range(count)]
                w[:, cols], np.asarray(b)[cols] = 0.0, offset  # b itself: asarray of an array is the array
            needed += [f"{p}.self_attn.{x}" for x in ("scores", "scale", "mask", "softmax")]
        q_ref = (n_ref @ wq + bq).reshape(1, seq, heads, head).transpose(0, 2, 1, 3)
        k_ref = (n_ref @ wk + bk).reshape(1, seq, kv_heads, head).transpose(0, 2, 1, 3)
        v_ref = (n_ref @ wv + bv).reshape(1, seq, kv_heads, head).transpose(0, 2, 1, 3)
        k_rep, v_rep = np.repeat(k_ref, groups, axis=1), np.repeat(v_ref, groups, axis=1)
        scores = _rotary(q_ref, cos, sin) @ _rotary(k_rep, cos, sin).transpose(0, 1, 3, 2) / np.sqrt(head) + mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx_ref = (probs @ v_rep).transpose(0, 2, 1, 3).reshape(1, seq, hidden)
        q = linear(f"{p}.self_attn.q_proj", n, wq, bq)
        k = linear(f"{p}.self_attn.k_proj", n, wk, bk)
        v = linear(f"{p}.self_attn.v_proj", n, wv, bv)
        del wq, wk, wv
        q = node(
            "Transpose",
            [node("Reshape", [q, "split_q"], f"{p}.self_attn.q_split")],
            f"{p}.self_attn.q_heads",
            perm=[0, 2, 1, 3],
        )
        kv = {}
        for name, x in (("k", k), ("v", v)):
            x = node(
                "Transpose",
                [node("Reshape", [x, "split_kv"], f"{p}.self_attn.{name}_split")],
                f"{p}.self_attn.{name}_heads",
                perm=[0, 2, 1, 3],
            )
            x = node("Unsqueeze", [x, "kv_axis"], f"{p}.self_attn.{name}_unsqueeze")  # repeat_kv: expand, reshape
            x = node("Expand", [x, "expand_kv"], f"{p}.self_attn.{name}_expand")
            kv[name] = node("Reshape", [x, "merge_kv"], f"{p}.self_attn.{name}_repeat")
        q = rotary(f"{p}.self_attn.q_rotary", q)
        k = rotary(f"{p}.self_attn.k_rotary", kv["k"])
        kt = node("Transpose", [k], f"{p}.self_attn.k_transpose", perm=[0, 1, 3, 2])
        scaled = node("Mul", [node("MatMul", [q, kt], f"{p}.self_attn.scores"), "scale"], f"{p}.self_attn.scale")
        probs_name = node(
            "Softmax", [node("Add", [scaled, "mask"], f"{p}.self_attn.mask")], f"{p}.self_attn.softmax", axis=-1
        )
        ctx = node("MatMul", [probs_name, kv["v"]], f"{p}.self_attn.context")
        ctx = node("Transpose", [ctx], f"{p}.self_attn.merge_transpose", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, "merge_heads"], f"{p}.self_attn.merge")
        wo = draw(hidden, hidden)
        h_ref = h_ref + ctx_ref @ wo
        h = node("Add", [h, linear(f"{p}.self_attn.o_proj", ctx, wo)], f"{p}.attn_residual")
        del wo
        n, n_ref = rmsnorm(f"{p}.post_attention_layernorm", h, h_ref)
        wg, wu = draw(hidden, intermediate), draw(hidden, intermediate)
        gate_ref = n_ref @ wg
        act_ref = gate_ref / (1 + np.exp(-gate_ref)) * (n_ref @ wu)
        gate = linear(f"{p}.mlp.gate_proj", n, wg)
        up = linear(f"{p}.mlp.up_proj", n, wu)
        del wg, wu
        silu = node("Mul", [gate, node("Sigmoid", [gate], f"{p}.mlp.sigmoid")], f"{p}.mlp.silu")
        act = node("Mul", [silu, up], f"{p}.mlp.act")
        wd = draw(intermediate, hidden)
        added = act_ref @ wd
        if fault == "norm" and i == layers - 1:  # the final norm's input peaks at ``peak``
            gain = np.float32(peak / max(float(np.abs(h_ref + added).max()), 1e-6))
            base = float(np.abs(h_ref).max())
            gain = np.float32((peak - base) / max(float(np.abs(added).max()), 1e-6)) if base < peak else gain
            wd, added = wd * gain, added * gain
            needed += [f"norm.{x}" for x in ("pow", "mean", "add_eps", "sqrt")]
        h_ref = h_ref + added
        h = node("Add", [h, linear(f"{p}.mlp.down_proj", act, wd)], f"{p}.mlp_residual")
        del wd
    normed, _ = rmsnorm("norm", h, h_ref)
    logits = linear(
        "lm_head", normed, rng.standard_normal((hidden, vocab), dtype=np.float32) / np.float32(np.sqrt(hidden))
    )
    nodes.append(helper.make_node("Identity", [logits], ["logits"], name="output"))
    data.close()
    graph = helper.make_graph(
        nodes,
        "planted_decoder",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, vocab])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="planted_decoder")
    model.ir_version = 8
    (out / "decoder.onnx").write_bytes(model.SerializeToString())
    np.savez(out / "ids.npz", ids=ids)
    facts: Dict[str, Any] = {
        "model": str(out / "decoder.onnx"),
        "inputs": str(out / "ids.npz"),
        "needed": needed,
        "parameters": int(parameters),
        "weight_bytes": int(data.offset),
        "seconds": round(time.monotonic() - began, 1),
        "shape": {
            "layers": layers,
            "hidden": hidden,
            "intermediate": intermediate,
            "heads": heads,
            "kv_heads": kv_heads,
            "vocab": vocab,
            "seq": seq,
            "fault": fault,
        },
    }
    (out / "needed.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--vocab", type=int)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--fault", choices=("attention", "norm"), default="attention")
    parser.add_argument("--logit-peak", type=float, default=1e6)
    parser.add_argument("--peak", type=float, default=2000.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    layers, hidden, intermediate, heads, kv_heads, vocab = PRESETS[args.preset]
    args.out.mkdir(parents=True, exist_ok=True)
    facts = write_decoder(
        args.out,
        args.layers or layers,
        hidden,
        intermediate,
        heads,
        kv_heads,
        args.vocab or vocab,
        args.seq,
        args.fault,
        args.logit_peak,
        args.peak,
        args.seed,
    )
    print(json.dumps({k: v for k, v in facts.items() if k != "needed"}), f"needed: {len(facts['needed'])} nodes")


if __name__ == "__main__":
    main()
