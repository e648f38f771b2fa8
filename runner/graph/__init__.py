"""ONNX graph work: load and save, shape inference, subgraphs, validation, weights and summaries."""
