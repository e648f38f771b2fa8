"""Benchmark (GPU machine): a Qwen2-0.5B-architecture decoder with a planted RMSNorm overflow, debugged with
CUDA-EP verdicts: ``mode=precision marker=minimal`` and ``mode=layerwise``.

Needs torch and transformers (the GPU machine has them) and onnxruntime-gpu (``../shared/gpu/README.md``).
The decoder has random weights (``Qwen2Config`` of Qwen2-0.5B: 24 layers, width 896, 14 heads, 2 KV heads,
MLP 4864, vocabulary 151936, tied embeddings) and its last MLP's ``down_proj`` scaled so that the
final RMSNorm's input peaks at ``--peak`` (2000 by default): within fp16's range, while its ``x*x``
(4e6) is not, so that norm's Pow, ReduceMean, Add and Sqrt must stay in fp32. It is exported with
torch.onnx (TorchScript, opset 17, weights as external data) and fed 8 token ids.

Each run is a process of its own; the figures (checks, wall seconds, peak RSS of the run's process,
kept nodes, layerwise's first divergence and top introduced nodes) are printed and written to
``--out``/qwen_gpu.json.

Usage: python benchmarks/qwen_on_gpu.py [--layers 24] [--out DIR] [--skip-layerwise]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: peak RSS (KB) of one child process: ``python -c WRAP cmd...`` prints it after the command's own output
WRAP = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
    "print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)"
)


def export(work: Path, layers: int, peak: float, seq: int) -> tuple:
    """Export the decoder; (model path, inputs path, model bytes, seconds)."""
    import numpy as np
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    start = time.perf_counter()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        use_cache=False,
    )
    model = Qwen2ForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, seq))
    seen: dict = {}
    hook = model.model.norm.register_forward_pre_hook(lambda m, a: seen.update(x=a[0].detach().abs().max().item()))
    with torch.no_grad():
        for _ in range(3):  # the last MLP's output dominates the residual once scaled: converge on the peak
            model(ids)
            model.model.layers[-1].mlp.down_proj.weight.mul_(peak / max(seen["x"], 1e-6))
        model(ids)
    hook.remove()
    print(f"final RMSNorm input peaks at {seen['x']:.0f} (fp16's largest is 65504; x*x is {seen['x'] ** 2:.3g})")
    path = work / "qwen2.onnx"

    class Logits(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            # an explicit mask: without one, transformers looks for packed sequences with aten::diff,
            # which the TorchScript exporter cannot export
            return self.inner(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits

    with torch.no_grad():
        torch.onnx.export(
            Logits(model),
            (ids,),
            str(path),
            input_names=["input_ids"],
            output_names=["logits"],
            opset_version=17,
            dynamo=False,
        )
    import onnx

    loaded = onnx.load(str(path))
    onnx.save_model(loaded, str(path), save_as_external_data=True, location="qwen2.onnx.data", size_threshold=1024)
    inputs = work / "ids.npz"
    np.savez(inputs, input_ids=ids.numpy())
    size = sum(p.stat().st_size for p in work.glob("qwen2.onnx*"))
    return path, inputs, size, time.perf_counter() - start


def run(args, run_dir: Path) -> dict:
    """``python -m runner ARGS`` in its own process: wall seconds, peak RSS (MB), exit code, summary."""
    start = time.perf_counter()
    cmd = [sys.executable, "-c", WRAP, sys.executable, "-m", "runner", *args, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    peak = next((int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("PEAK_KB")), 0)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    if proc.returncode:
        print(proc.stderr[-3000:])
    return {"wall_s": round(wall, 1), "peak_rss_mb": round(peak / 1024), "exit": proc.returncode, "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--peak", type=float, default=2000.0)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--work", default="/tmp/qwen_gpu")
    parser.add_argument("--out", default=".")
    parser.add_argument("--skip-layerwise", action="store_true")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    path, inputs, size, seconds = export(work, args.layers, args.peak, args.seq)
    print(f"exported {path} ({size / 2**20:.0f} MB with its external data) in {seconds:.0f} s")
    cuda = ["checker=compare", "checker.providers=[CUDAExecutionProvider]", "checker.check_error_stat=rel_l2"]
    cuda.append("checker.rtol=0.05")
    figures = {"model_mb": round(size / 2**20), "layers": args.layers, "export_s": round(seconds)}
    data = [f"model={path}", f"inputs={inputs}"]
    precision = run(["mode=precision", "marker=minimal", *data, *cuda], work / "precision")
    s = precision.pop("summary")
    figures["precision"] = {
        **precision,
        "checks": s.get("checks"),
        "kept": s.get("kept"),
        "total": s.get("total"),
        "kept_nodes": [n["name"] for n in s.get("kept_nodes", [])],
        "answer_verified": (s.get("answer_verified") or {}).get("passed"),
        "status": s.get("status"),
    }
    print(json.dumps(figures["precision"], indent=1))
    if not args.skip_layerwise:
        layerwise = run(["mode=layerwise", *data, *cuda, "checker.low_precision=float16"], work / "layerwise")
        s = layerwise.pop("summary")
        figures["layerwise"] = {
            **layerwise,
            "first_divergence": (s.get("first_divergence") or {}).get("node"),
            "top_introduced": [t["node"] for t in s.get("top_introduced", [])[:6]],
            "status": s.get("status"),
        }
        print(json.dumps(figures["layerwise"], indent=1))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "qwen_gpu.json").write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
