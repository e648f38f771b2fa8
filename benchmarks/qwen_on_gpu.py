"""Benchmark (GPU machine): a Qwen2-0.5B-architecture decoder with a planted fp16 overflow, debugged with
CUDA-EP verdicts: ``mode=precision marker=minimal`` and ``mode=layerwise``.

Two faults (``--fault``): ``norm`` (the default, below), or ``attention``: every layer's q_proj and k_proj
scaled so that the largest raw attention score ``q.k`` is about ``--logit-peak`` (1e6), the failure that
made Stable Diffusion 2.x ship ``upcast_attention``; every block then needs the same fix. ``--hidden``,
``--intermediate``, ``--heads``, ``--kv-heads`` and ``--vocab`` shrink the architecture (the issue's 56M
decoder: ``--layers 8 --hidden 768 --intermediate 2048 --heads 12 --kv-heads 2 --vocab 8000``).

Needs torch and transformers (the GPU machine has them) and onnxruntime-gpu (``../shared/gpu/README.md``).
The decoder has random weights (``Qwen2Config`` of Qwen2-0.5B: 24 layers, width 896, 14 heads, 2 KV heads,
MLP 4864, vocabulary 151936, tied embeddings) and its last MLP's ``down_proj`` scaled so that the
final RMSNorm's input peaks at ``--peak`` (2000 by default): within fp16's range, while its ``x*x``
(4e6) is not, so that norm's Pow, ReduceMean, Add and Sqrt must stay in fp32. It is exported with
torch.onnx (TorchScript, opset 17, weights as external data) and fed 8 token ids.

Each run is a process of its own; the figures (checks, wall seconds, peak RSS of the run's process,
kept nodes, layerwise's first divergence and top introduced nodes) are printed and written to
``--out``/qwen_gpu.json.

``--extra checker.graph_optimization_level=disable`` runs the precision search's candidates as feeds of fp16's
native switchboard (one session; ``runner.checkers.compare.switched``) instead of a session each.

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


def _scale_attention(model, ids, logit_peak: float) -> None:
    """Scale every layer's q_proj and k_proj (weight and bias) so that its largest raw score q.k (per head,
    before the 1/sqrt(head_dim) scale, rotary embedding left out: it keeps norms) is ``logit_peak``."""
    import torch

    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head = config.hidden_size // heads
    seen: dict = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        for name in ("q_proj", "k_proj"):
            proj = getattr(layer.self_attn, name)
            hooks.append(proj.register_forward_hook(lambda m, a, out, key=(i, name): seen.update({key: out.detach()})))
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            q = seen[(i, "q_proj")].reshape(ids.shape[1], heads, head).transpose(0, 1)
            k = seen[(i, "k_proj")].reshape(ids.shape[1], kv_heads, head).transpose(0, 1)
            k = k.repeat_interleave(heads // kv_heads, dim=0)
            peak = float((q @ k.transpose(1, 2)).abs().max())
            gain = (logit_peak / max(peak, 1e-6)) ** 0.5
            for name in ("q_proj", "k_proj"):
                proj = getattr(layer.self_attn, name)
                proj.weight.mul_(gain)
                if proj.bias is not None:
                    proj.bias.mul_(gain)
    print(f"q_proj and k_proj of {len(model.model.layers)} layers scaled: largest raw score about {logit_peak:.3g}")


def export(work: Path, layers: int, peak: float, seq: int, args=None) -> tuple:
    """Export the decoder; (model path, inputs path, model bytes, seconds)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    start = time.perf_counter()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=getattr(args, "vocab", 151936),
        hidden_size=getattr(args, "hidden", 896),
        intermediate_size=getattr(args, "intermediate", 4864),
        num_hidden_layers=layers,
        num_attention_heads=getattr(args, "heads", 14),
        num_key_value_heads=getattr(args, "kv_heads", 2),
        max_position_embeddings=512,
        tie_word_embeddings=True,
        use_cache=False,
    )
    model = Qwen2ForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, seq))
    if getattr(args, "fault", "norm") == "attention":
        _scale_attention(model, ids, args.logit_peak)
        return _save(work, model, ids, start)
    seen: dict = {}
    hook = model.model.norm.register_forward_pre_hook(lambda m, a: seen.update(x=a[0].detach().abs().max().item()))
    with torch.no_grad():
        for _ in range(3):  # the last MLP's output dominates the residual once scaled: converge on the peak
            model(ids)
            model.model.layers[-1].mlp.down_proj.weight.mul_(peak / max(seen["x"], 1e-6))
        model(ids)
    hook.remove()
    print(f"final RMSNorm input peaks at {seen['x']:.0f} (fp16's largest is 65504; x*x is {seen['x'] ** 2:.3g})")
    return _save(work, model, ids, start)


def _save(work: Path, model, ids, start: float) -> tuple:
    """Export ``model`` with torch.onnx (TorchScript, opset 17, weights as external data) and its ids."""
    import numpy as np
    import torch

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


def _verdict_seconds(log: Path, phrase: str = "Most of the model may have to stay"):
    """Seconds from the run's first log line to the first line holding ``phrase`` (by default the early verdict
    that most must stay; ``At most`` for the first passing candidate's bound), or None when it has none."""
    import datetime

    if not log.is_file():
        return None
    stamps = []
    for line in log.read_text().splitlines():
        if line.startswith("[") and "]" in line:
            try:
                stamps.append((datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f"), line))
            except ValueError:
                continue
    said = [t for t, line in stamps if phrase in line]
    return round((said[0] - stamps[0][0]).total_seconds(), 1) if said and stamps else None


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
    parser.add_argument("--fault", choices=["norm", "attention"], default="norm")
    parser.add_argument("--logit-peak", type=float, default=1e6)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--intermediate", type=int, default=4864)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for the precision run")
    parser.add_argument("--name", default="qwen_gpu", help="the figures go to OUT/NAME.json")
    parser.add_argument("--export-only", action="store_true", help="export to WORK and stop (for check_phases.py)")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    path, inputs, size, seconds = export(work, args.layers, args.peak, args.seq, args)
    print(f"exported {path} ({size / 2**20:.0f} MB with its external data) in {seconds:.0f} s")
    if args.export_only:
        return
    cuda = ["checker=compare", "checker.providers=[CUDAExecutionProvider]", "checker.check_error_stat=rel_l2"]
    cuda.append("checker.rtol=0.05")
    figures = {"model_mb": round(size / 2**20), "layers": args.layers, "export_s": round(seconds), "fault": args.fault}
    data = [f"model={path}", f"inputs={inputs}"]
    precision = run(["mode=precision", "marker=minimal", *data, *cuda, *args.extra], work / "precision")
    s = precision.pop("summary")
    figures["precision"] = {
        **precision,
        "checks": s.get("checks"),
        "kept": s.get("kept"),
        "total": s.get("total"),
        "kept_nodes": [n["name"] for n in s.get("kept_nodes", [])],
        "answer_verified": (s.get("answer_verified") or {}).get("passed"),
        "status": s.get("status"),
        "blocks": {k: v for k, v in (s.get("blocks") or {}).items() if k != "kept_positions"},
        "kept_positions": [
            (p["position"], len(p["blocks"]), p["unit"]) for p in (s.get("blocks") or {}).get("kept_positions", [])
        ],
        "ranked_again": s.get("ranked_again"),
        "most_must_stay": s.get("most_must_stay"),
        "verdict_s": _verdict_seconds(work / "precision" / "runner.log"),
        "first_pass": s.get("first_pass"),
        "first_pass_s": _verdict_seconds(work / "precision" / "runner.log", "nodes must stay in float32"),
        "minimal": s.get("minimal", True),
        "budget": s.get("budget"),
        "reference_spread": s.get("reference_spread"),
        "error": s.get("status") if s.get("status") != "ok" else None,
    }
    print(json.dumps(figures["precision"], indent=1), flush=True)
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
    (Path(args.out) / f"{args.name}.json").write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
