"""A subgraph's ``GraphProto`` from parts exported once: what ``GraphIndex.extract`` writes per candidate."""

from __future__ import annotations

from typing import Dict, List, Tuple

import onnx
import onnx_graphsurgeon as gs

#: onnx-graphsurgeon's exporter, whose output ``PartsExporter`` reproduces
EXPORTER = gs.exporters.onnx_exporter.OnnxExporter


class PartsExporter:
    """Writes the graph of any subset of a model's nodes as onnx-graphsurgeon's ``export_graph`` writes
    it for that subgraph (nodes, initializers, the value info of every other typed tensor), from parts
    exported once: each node's ``NodeProto`` (under 64 KB), each initializer as the model holds it and
    each tensor's ``ValueInfoProto``. At 100,000 nodes graphsurgeon's export took 0.36 s a candidate,
    most of it exporting the same nodes again.

    Args:
        model: the model (its initializers are the protos written; not modified).
        graph: ``gs.import_onnx(model)``.
        nodes: ``graph``'s nodes, indexed as the subsets ``graph_proto`` takes.
        tensor_map: ``graph.tensors()``.
    """

    def __init__(self, model: onnx.ModelProto, graph: gs.Graph, nodes: List[gs.Node], tensor_map: Dict[str, gs.Tensor]):
        self.graph, self.nodes, self.tensor_map = graph, nodes, tensor_map
        self.sparse = bool(model.graph.sparse_initializer)
        self._protos: Dict[int, onnx.NodeProto] = {}
        self._tensors: Dict[int, List[Tuple[str, gs.Tensor]]] = {}
        self._value_infos: Dict[str, onnx.ValueInfoProto] = {}
        #: the model's own initializers by name (gs holds their values; the model's protos are the same tensors)
        self._initializers: Dict[str, onnx.TensorProto] = {t.name: t for t in model.graph.initializer}

    def graph_proto(self, order: List[int], inputs: List[str], outputs: List[str]) -> onnx.GraphProto:
        """The graph of nodes ``order`` with graph ``inputs`` and ``outputs`` (tensor names; their
        declarations as ``tensor_map`` holds them now).

        Returns:
            A new ``GraphProto``; graphsurgeon's own export where the model has sparse initializers.
        """
        if self.sparse:  # rare: graphsurgeon's own export handles them
            sub = gs.Graph(
                nodes=[self.nodes[i] for i in order],
                inputs=[self.tensor_map[n] for n in inputs],
                outputs=[self.tensor_map[n] for n in outputs],
                name=self.graph.name,
                doc_string=self.graph.doc_string,
            )
            return EXPORTER.export_graph(sub, do_type_check=False)
        tensors: Dict[str, gs.Tensor] = {}
        for name in inputs:
            tensors[name] = self.tensor_map[name]
        for i in order:
            tensors.update(self._tensors_of(i))
        for name in outputs:
            tensors[name] = self.tensor_map[name]
        io = set(inputs) | set(outputs)
        initializers, value_info = [], []
        for name, t in tensors.items():
            if isinstance(t, gs.Constant):
                initializers.append(self._initializers.get(name) or EXPORTER.export_tensor_proto(t))
            elif name not in io and (t.dtype is not None or t.shape is not None):
                value_info.append(self._value_info(t))
        return onnx.helper.make_graph(
            nodes=[self._node_proto(i) for i in order],
            name=self.graph.name,
            inputs=[EXPORTER.export_value_info_proto(self.tensor_map[n], False) for n in inputs],
            outputs=[EXPORTER.export_value_info_proto(self.tensor_map[n], False) for n in outputs],
            initializer=initializers,
            doc_string=self.graph.doc_string,
            value_info=value_info,
        )

    def _tensors_of(self, i: int) -> List[Tuple[str, gs.Tensor]]:
        """Node ``i``'s named input and output tensors, ``(name, tensor)`` (listed once)."""
        found = self._tensors.get(i)
        if found is None:
            node = self.nodes[i]
            found = self._tensors[i] = [(t.name, t) for t in list(node.inputs) + list(node.outputs) if not t.is_empty()]
        return found

    def _node_proto(self, i: int) -> onnx.NodeProto:
        """Node ``i`` exported (kept for the next candidate when under 64 KB: a Constant holding weights is not)."""
        proto = self._protos.get(i)
        if proto is None:
            proto = EXPORTER.export_node(self.nodes[i])
            if proto.ByteSize() < 65536:
                self._protos[i] = proto
        return proto

    def _value_info(self, tensor: gs.Tensor) -> onnx.ValueInfoProto:
        """A typed tensor's ``ValueInfoProto`` as written between nodes (made once)."""
        proto = self._value_infos.get(tensor.name)
        if proto is None:
            proto = self._value_infos[tensor.name] = EXPORTER.export_value_info_proto(tensor, False)
        return proto
