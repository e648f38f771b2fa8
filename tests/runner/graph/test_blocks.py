"""Repeated blocks found in real exports (TorchScript names, dynamo name scopes, hand-built names) and by
isomorphic runs, and none where a model does not repeat."""

from __future__ import annotations

import onnx
import pytest

from examples.planted import GRAPHS, attention_decoder, rmsnorm_decoder
from runner.graph.blocks import find_blocks, node_scope
from runner.lowp.convert import float_nodes, prepare
from tests.helpers.models import CLASSIFIER, DETECTOR, MODELS, VAD, need


def blocks_of(model: onnx.ModelProto):
    model = prepare(model)
    return model, find_blocks(model, float_nodes(model))


def test_a_hand_built_decoder_ties_each_position_across_its_layers():
    model, blocks = blocks_of(attention_decoder(layers=6)[0])
    assert blocks is not None and blocks.how == "name scopes"
    assert blocks.families == {"layers": [f"layers.{i}" for i in range(6)]}
    scores = next(t for t in blocks.ties if t.label == "layers.*.self_attn.scores")
    assert [model.graph.node[i].name for i in scores.nodes] == [f"layers.{i}.self_attn.scores" for i in range(6)]
    assert scores.blocks == tuple(f"layers.{i}" for i in range(6))
    assert all(len(t.nodes) == 6 for t in blocks.ties)
    outside = {model.graph.node[i].name for i in float_nodes(model)} - {
        model.graph.node[i].name for i in blocks.tied_nodes
    }
    assert "embed_tokens" in outside and "lm_head.matmul" in outside


@pytest.mark.parametrize(
    "name, family, ties",
    [("bert_tiny", "/m/encoder/layer", 38), ("gpt2_tiny", "m.h", 42), ("vit_tiny", "/m/blocks/blocks", 38)],
)
def test_real_exports_repeat_their_layers(name, family, ties):
    """TorchScript's ``/m/encoder/layer.3/...`` names and the dynamo exporter's name-scope metadata."""
    model, blocks = blocks_of(onnx.load(str(need(MODELS / "zoo" / f"{name}.onnx"))))
    assert blocks is not None and blocks.how == "name scopes"
    assert list(blocks.families) == [family] and len(blocks.families[family]) == 4
    assert len(blocks.ties) == ties
    for tie in blocks.ties:  # one node per block, each of the same op type
        assert len(set(tie.blocks)) == len(tie.nodes)
        assert len({model.graph.node[i].op_type for i in tie.nodes}) == 1


def test_dynamo_names_carry_no_block_but_their_scopes_do():
    model = onnx.load(str(need(MODELS / "zoo" / "gpt2_tiny.onnx")))
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    assert softmax.name.startswith("node_") and node_scope(softmax) == "m.h.0.attn"


def test_mobilenet_blocks_repeat_as_isomorphic_runs():
    """The classifier is named ``p2o.Conv.5`` (no scopes): its four repeated blocks are found as runs of the
    same op types; the detector repeats its block three times, too few to tie."""
    model, blocks = blocks_of(onnx.load(str(need(CLASSIFIER))))
    assert blocks is not None and blocks.how == "isomorphic runs"
    assert len(blocks.families["run"]) == 4
    for tie in blocks.ties:
        assert len({model.graph.node[i].op_type for i in tie.nodes}) == 1
    assert blocks_of(onnx.load(str(need(DETECTOR))))[1] is None


@pytest.mark.parametrize("make", list(GRAPHS.values()), ids=list(GRAPHS))
def test_models_without_repeats_have_no_blocks(make):
    assert blocks_of(make()[0])[1] is None


def test_a_recurrent_model_has_no_blocks():
    assert blocks_of(onnx.load(str(need(VAD))))[1] is None


def test_only_the_searched_nodes_are_tied():
    model, blocks = blocks_of(rmsnorm_decoder(layers=4)[0])
    assert blocks is not None
    norms = [i for i, n in enumerate(model.graph.node) if ".norm." in n.name]
    few = find_blocks(model, norms)
    assert few is not None and few.tied_nodes == frozenset(norms)
    assert find_blocks(model, norms[:3]) is None
    assert blocks_of(rmsnorm_decoder(layers=3)[0])[1] is None
