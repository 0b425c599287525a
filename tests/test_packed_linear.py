"""Linear layers on prepacked weights compute what `F.linear` computes (up to float32
rounding), only for CPU float32 inference, never on a stale copy of an edited weight, and
leave training and hooks as they were."""

import pytest
import torch
from torch import nn

from rnr_interp.models import packed_linear
from rnr_interp.engine.decoding import Decoding
from rnr_interp.engine.generate import generate
from rnr_interp.models import load_model

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="this torch has no oneDNN prepacked linear")


def packed(layer: nn.Linear) -> nn.Linear:
    wrapper = nn.Sequential(layer)
    assert packed_linear.install(wrapper) == 1
    assert type(layer) is packed_linear.PackedLinear and isinstance(layer, nn.Linear)
    return layer


def oneDNN_calls(monkeypatch) -> list[int]:
    calls: list[int] = []
    op = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(packed_linear.torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(1) or op(*a), raising=False)
    return calls


@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_equals_the_plain_one(bias):
    torch.manual_seed(0)
    layer = nn.Linear(96, 40, bias=bias)
    reference = nn.Linear(96, 40, bias=bias)
    reference.load_state_dict(layer.state_dict())
    packed(layer)
    with torch.no_grad():
        for x in (torch.randn(5, 96), torch.randn(3, 7, 96), torch.randn(7, 3, 96).transpose(0, 1), torch.randn(1, 96)):
            got, want = layer(x), reference(x)
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert "_packed" in layer.__dict__ and "_packed" not in layer.state_dict()


def test_only_cpu_float32_inference_takes_the_packed_path(monkeypatch):
    torch.manual_seed(0)
    layer = packed(nn.Linear(16, 8))
    calls = oneDNN_calls(monkeypatch)
    x = torch.randn(4, 16)
    with torch.inference_mode():
        layer(x)
    assert calls == [1]
    out = layer(x.requires_grad_())  # training: autograd through F.linear
    out.sum().backward()
    assert layer.weight.grad is not None and calls == [1]
    assert "_packed" not in layer.__dict__  # dropped: the optimiser is about to change the weight
    with torch.no_grad():
        layer(torch.randn(0, 16))
        layer.double()(torch.randn(2, 16, dtype=torch.float64))
    assert calls == [1]


def test_an_edited_weight_is_repacked():
    torch.manual_seed(0)
    layer = packed(nn.Linear(16, 8))
    x = torch.randn(3, 16)
    with torch.no_grad():
        first = layer(x)
        layer.weight.mul_(2)  # in place
        torch.testing.assert_close(layer(x), 2 * first - layer.bias, rtol=1e-5, atol=1e-5)
        layer.weight = nn.Parameter(torch.zeros(8, 16))  # replaced
        torch.testing.assert_close(layer(x), layer.bias.expand(3, 8))
        layer.weight.data = torch.ones(8, 16)  # storage swapped
        torch.testing.assert_close(layer(x), x.sum(-1, keepdim=True) + layer.bias, rtol=1e-5, atol=1e-5)


def test_a_loaded_model_runs_packed_and_generates_as_the_plain_one(monkeypatch):
    lm = load_model("tiny-llama:3")
    linears = [m for m in lm.hf_model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is packed_linear.PackedLinear for m in linears)
    prompts = [[1, 5, 9, 13, 2], [1, 7, 3]]
    calls = oneDNN_calls(monkeypatch)
    packed_rows = generate(lm, prompts, decoding=Decoding(max_new_tokens=6))
    assert len(calls) >= len(linears)
    packed_linear.uninstall(lm.hf_model)
    calls.clear()
    plain_rows = generate(lm, prompts, decoding=Decoding(max_new_tokens=6))
    assert calls == []
    for [p], [q] in zip(packed_rows, plain_rows):
        assert p.tokens == q.tokens
        assert p.logprob == pytest.approx(q.logprob, abs=1e-4)


def test_a_used_layer_copies_and_pickles_without_its_packed_weight():
    import copy
    import io

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4))
    packed_linear.install(model)
    x = torch.randn(2, 8)
    with torch.no_grad():
        want = model(x)
    assert "_packed" in model[0].__dict__
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for clone in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
        assert type(clone[0]) is packed_linear.PackedLinear and "_packed" not in clone[0].__dict__
        with torch.no_grad():
            torch.testing.assert_close(clone(x), want)
    assert "_packed" in model[0].__dict__  # the original keeps its copy


def test_dense_linear_is_kept_on_request(monkeypatch):
    monkeypatch.setenv("RNR_LINEAR", "dense")
    assert not packed_linear.available()
    assert packed_linear.install(nn.Sequential(nn.Linear(4, 4))) == 0
