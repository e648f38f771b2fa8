"""A stand-in for a backend bug: the check fails (exit 1) while the model holds every node named.

Usage: python examples/check_node.py MODEL.onnx NODE_NAME [NODE_NAME ...]

Real checks run the model on the backend that misbehaves (e.g. `polygraphy run --trt`, or your
own script) and exit non-zero when it does; this one just looks the nodes up, so the example runs
anywhere. It also loads the model in ONNX Runtime, to prove each candidate is a runnable model.
"""

import sys

import onnx
import onnxruntime as ort

model = onnx.load(sys.argv[1])
ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
names = {n.name for n in model.graph.node}
missing = [n for n in sys.argv[2:] if n not in names]
print(
    f"{len(model.graph.node)} nodes; "
    + ("all named nodes present: FAIL" if not missing else f"absent: {missing}: pass")
)
sys.exit(0 if missing else 1)
