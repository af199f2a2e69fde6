"""models/head_loss.py head_cross_entropy: the vocabulary projection and the loss, a block of
rows or of words at a time, equal to projecting first and taking the loss of the logits,
without the (N, V) logits."""

import collections
import functools

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from vaswani.config import ModelConfig
from vaswani.cpu.quantized import WeightOnlyLinear
from vaswani.models import head_loss
from vaswani.models.decoder_lm import DecoderLM
from vaswani.models.head_loss import head_cross_entropy
from vaswani.models.losses import reference_smoothed_cross_entropy

N, D, V, PAD = 23, 8, 17, 0


def case(dtype=torch.float64):
    torch.manual_seed(0)
    h = torch.randn(N, D, dtype=dtype, requires_grad=True)
    head = nn.Linear(D, V, bias=False).to(dtype)
    target = torch.randint(1, V, (N,))
    target[[3, 9, 22]] = PAD
    return h, head, target


@pytest.fixture(autouse=True)
def several_chunks(monkeypatch):
    monkeypatch.setattr(head_loss, "HEAD_CHUNK_ELEMENTS", 5 * V)  # 5 rows a chunk: 5 chunks
    monkeypatch.setattr(head_loss, "ROW_BLOCK", 6)  # a frozen float head's 17 words: 6, 6, 5


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("pad_id", [None, PAD])
@pytest.mark.parametrize("head_trains", [True, False])
def test_the_head_loss_and_its_gradients_equal_projecting_first(eps, pad_id, head_trains):
    h, head, target = case()
    head.weight.requires_grad_(head_trains)
    loss, nll, count = head_cross_entropy(h, head, target, smoothing=eps, pad_id=pad_id)
    (loss * 0.7).backward()
    got = h.grad.clone(), head.weight.grad
    h.grad = head.weight.grad = None
    ref_loss, ref_nll, ref_count = reference_smoothed_cross_entropy(
        head(h), target, smoothing=eps, pad_id=pad_id)
    (ref_loss * 0.7).backward()
    assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    assert_close(nll, ref_nll, rtol=1e-12, atol=1e-12)
    assert count == ref_count
    assert_close(got[0], h.grad, rtol=1e-12, atol=1e-12)
    if head_trains:
        assert_close(got[1], head.weight.grad, rtol=1e-12, atol=1e-12)
    else:
        assert got[1] is None and head.weight.grad is None


def test_a_tied_head_gets_the_sum_of_both_uses_gradients():
    h, head, target = case()
    table = nn.Embedding(V, D).double()
    head.weight = table.weight
    ids = torch.randint(0, V, (4,))

    def total(fn):
        table.weight.grad = None
        (table(ids).sum() + fn()).backward()
        return table.weight.grad.clone()

    got = total(lambda: head_cross_entropy(h, head, target, smoothing=0.1, pad_id=PAD)[0])
    want = total(lambda: reference_smoothed_cross_entropy(head(h), target, smoothing=0.1,
                                                          pad_id=PAD)[0])
    assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bits", [8, 4])
def test_a_quantized_frozen_head_gives_its_own_logits_loss_and_input_gradient(bits,
                                                                             monkeypatch,
                                                                             request):
    """QLoRA: the head multiplies by its int8/int4 weights; the input's gradient goes through
    the weights it multiplies by, as the layer's own backward sends it. An int8 table (a tied
    head's) is dequantized a block of words at a time, never whole."""
    if bits == 4:
        request.getfixturevalue("on_cpu")  # int4's packing and product are CPU kernels
    h, head, target = case(torch.float32)
    q = WeightOnlyLinear.of(nn.Linear(64, 64, bias=False), bits)  # int4 packs 64 inputs
    monkeypatch.setattr(head_loss, "ROW_BLOCK", 24)  # blocks of 24, 24 and 16 words
    if bits == 8:
        monkeypatch.setattr(q, "dequantized", lambda: pytest.fail("the whole table made"))
    h64 = torch.randn(N, 64, requires_grad=True)
    target = target % 64
    loss, nll, _ = head_cross_entropy(h64, q, target, smoothing=0.1, pad_id=PAD)
    loss.backward()
    got = h64.grad.clone()
    h64.grad = None
    ref, ref_nll, _ = reference_smoothed_cross_entropy(q(h64), target, smoothing=0.1, pad_id=PAD)
    monkeypatch.undo()  # the layer's own backward dequantizes whole
    ref.backward()
    assert_close(loss, ref)
    assert_close(nll, ref_nll)
    assert_close(got, h64.grad)


@pytest.mark.parametrize("bits", [8, 4])
def test_validation_through_a_quantized_head_never_makes_its_matrix(bits, monkeypatch,
                                                                   request):
    """Without gradients the loss needs only the head's own product, chunk by chunk: an int4
    head (an untied one) is not dequantized whole to find that out, nor an int8 one."""
    if bits == 4:
        request.getfixturevalue("on_cpu")  # int4's packing and product are CPU kernels
    _, _, target = case(torch.float32)
    q = WeightOnlyLinear.of(nn.Linear(64, 64, bias=False), bits)
    h64, target = torch.randn(N, 64), target % 64
    want, want_nll, _ = reference_smoothed_cross_entropy(q(h64), target, smoothing=0.1,
                                                         pad_id=PAD)
    monkeypatch.setattr(q, "dequantized", lambda: pytest.fail("the whole matrix made"))
    monkeypatch.setattr(q, "dequantized_rows", lambda *a: pytest.fail("a block made"))
    with torch.no_grad():
        loss, nll, _ = head_cross_entropy(h64, q, target, smoothing=0.1, pad_id=PAD)
    assert_close(loss, want)
    assert_close(nll, want_nll)


def test_a_head_that_is_more_than_its_matrix_is_applied_whole():
    h, _, target = case()
    head = nn.Linear(D, V).double()  # a bias that trains: no single matrix to chunk by
    assert head_loss.head_matrix(head) is None
    loss, _, _ = head_cross_entropy(h, head, target, smoothing=0.1, pad_id=PAD)
    ref, _, _ = reference_smoothed_cross_entropy(head(h), target, smoothing=0.1, pad_id=PAD)
    assert_close(loss, ref)


def saved_sizes(fn) -> list[int]:
    """The number of elements of every tensor autograd saves while ``fn`` runs."""
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sizes


def test_the_logits_are_never_saved_for_backward_nor_made_whole():
    h, head, target = case()
    calls = []
    head.register_forward_hook(lambda m, args, out: calls.append(out.shape[0]))
    sizes = saved_sizes(lambda: head_cross_entropy(h, head, target, pad_id=PAD))
    assert max(calls) == 5 and sum(calls) == N  # chunks of five rows
    assert max(sizes) < N * V  # nothing the size of the logits; the plain way saves them:
    assert max(saved_sizes(lambda: reference_smoothed_cross_entropy(head(h), target))) >= N * V


class Outputs(torch.utils._python_dispatch.TorchDispatchMode):
    """The shape of every tensor the operations make, and the operations by name."""

    def __init__(self):
        super().__init__()
        self.shapes = []
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops[str(func.overloadpacket)] += 1
        self.shapes += [tuple(t.shape) for t in torch.utils._pytree.tree_leaves(out)
                        if isinstance(t, torch.Tensor)]
        return out


def test_a_frozen_float_head_goes_through_its_words_a_block_at_a_time():
    """A frozen float head (LoRA's) is never applied whole, nor to a chunk of rows: its
    logits are made a block of words by a chunk of rows at a time (12 and 11 rows, by
    6, 6 and 5 words), and the loss is the projection's, with its gradient."""
    h, head, target = case()
    head.weight.requires_grad_(False)
    head.register_forward_hook(lambda *a: pytest.fail("the head applied to all its words"))
    with Outputs() as made:
        loss, nll, _ = head_cross_entropy(h, head, target, smoothing=0.1, pad_id=PAD)
    assert {s for s in made.shapes if len(s) == 2 and s[0] in (11, 12) and s[1] in (5, 6)} == \
        {(12, 6), (12, 5), (11, 6), (11, 5)}  # the logits, block by block
    assert not [s for s in made.shapes if s[-1:] == (V,)]  # nothing as wide as the vocabulary
    (loss * 0.7).backward()
    h_ref = h.detach().requires_grad_()
    ref, ref_nll, _ = reference_smoothed_cross_entropy(nn.functional.linear(h_ref, head.weight),
                                                       target, smoothing=0.1, pad_id=PAD)
    (ref * 0.7).backward()
    assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    assert_close(nll, ref_nll, rtol=1e-12, atol=1e-12)
    assert_close(h.grad, h_ref.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")
def test_a_frozen_float32_heads_blocks_multiply_through_onednn_where_the_cpu_uses_it(
        monkeypatch, on_cpu):
    """On AMD's CPUs (forced here, on any CPU) a frozen head's two products a block (the
    logits, then their softmax by the weights) go through oneDNN: the same loss and input
    gradient as the projection's in float32 rounding, no ATen product left."""
    monkeypatch.setattr("vaswani.cpu.linear.OneDNNLinear.onednn", True)
    h, head, target = case(torch.float32)
    head.weight.requires_grad_(False)
    with Outputs() as made:
        loss, _, _ = head_cross_entropy(h, head, target, smoothing=0.1, pad_id=PAD)
    assert made.ops["mkldnn._linear_pointwise"] == 2 * 2 * 3  # 2 chunks of rows x 3 blocks
    assert not {"aten.mm", "aten.addmm"} & set(made.ops)
    loss.backward()
    h_ref = h.detach().requires_grad_()
    ref, _, _ = reference_smoothed_cross_entropy(nn.functional.linear(h_ref, head.weight),
                                                 target, smoothing=0.1, pad_id=PAD)
    ref.backward()
    assert_close(loss, ref)
    assert_close(h.grad, h_ref.grad)


@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_the_running_maximum_is_rescaled_as_it_grows(scale):
    """Logits up to hundreds (rows whose largest word is in the last block): the sums kept
    against an earlier, smaller maximum are rescaled, or they would overflow or be lost."""
    h, head, target = case()
    head.weight.requires_grad_(False)
    with torch.no_grad():
        head.weight[-5:] *= scale  # the last block of words holds the largest logits
    h_ref = h.detach().requires_grad_()
    loss, _, _ = head_cross_entropy(h, head, target, pad_id=PAD)
    loss.backward()
    ref, _, _ = reference_smoothed_cross_entropy(nn.functional.linear(h_ref, head.weight),
                                                 target, pad_id=PAD)
    ref.backward()
    assert torch.isfinite(loss)
    assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    assert_close(h.grad, h_ref.grad, rtol=1e-12, atol=1e-10)


def test_validation_under_no_grad_computes_no_gradient(monkeypatch):
    h, head, target = case()
    products = []
    real = torch.Tensor.__matmul__
    monkeypatch.setattr(torch.Tensor, "__matmul__",
                        lambda a, b: products.append(a.shape) or real(a, b))
    with torch.no_grad():
        loss, _, _ = head_cross_entropy(h, head, target, pad_id=PAD)
    assert products == []
    assert_close(loss, reference_smoothed_cross_entropy(head(h), target, pad_id=PAD)[0])


def test_a_language_model_returns_the_loss_it_is_given_with_the_same_gradients():
    torch.manual_seed(0)
    config = ModelConfig(arch="decoder", d_model=16, n_heads=2, d_ff=32, n_decoder_layers=2,
                         vocab_size=V, pad_id=PAD, max_len=16, tie_embeddings=True, dropout=0.0)
    model = DecoderLM(config).double()
    ids, target = torch.randint(1, V, (3, 7)), torch.randint(0, V, (3, 7))
    criterion = functools.partial(head_cross_entropy, target=target.flatten(), smoothing=0.1,
                                  pad_id=PAD)
    loss, _, _ = model(ids, mask=True, loss=criterion)
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref, _, _ = reference_smoothed_cross_entropy(model(ids, mask=True).flatten(0, 1),
                                                 target.flatten(), smoothing=0.1, pad_id=PAD)
    ref.backward()
    assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    for n, p in model.named_parameters():
        assert_close(got[n], p.grad, rtol=1e-10, atol=1e-12, msg=n)


def test_a_built_language_models_own_head_is_chunked():
    """build_model hands a CPU model cpu/linear.py's layers: the head is still one matrix."""
    from vaswani.models import build_model

    config = ModelConfig(arch="decoder", d_model=16, n_heads=2, d_ff=32, n_decoder_layers=1,
                         vocab_size=512, pad_id=PAD, max_len=16, tie_embeddings=True)
    model = build_model(config).train()
    assert head_loss.head_matrix(model.output_proj) is model.output_proj.weight
    ids = torch.randint(1, 512, (3, 7))
    criterion = functools.partial(head_cross_entropy, target=ids.flatten(), pad_id=PAD)
    sizes = saved_sizes(lambda: model(ids, mask=True, loss=criterion))
    assert max(sizes) < 3 * 7 * 512


@pytest.mark.parametrize("kind", ["frozen head", "head trains", "logits"])
def test_compiled_the_losses_give_the_eager_gradients(kind):
    """Under torch.compile, as a compiled training step calls them: the same loss and
    gradients. (torch 2.11 gave a zero gradient to an autograd function's output that its
    forward had summed into in place: every compiled LoRA step on a CPU trained nothing.)"""
    from vaswani.models.losses import smoothed_cross_entropy

    h, head, target = case()
    head.weight.requires_grad_(kind == "head trains")

    def loss(h):
        if kind == "logits":
            total, _, count = smoothed_cross_entropy(head(h), target, smoothing=0.1,
                                                     pad_id=PAD)
        else:
            total, _, count = head_cross_entropy(h, head, target, smoothing=0.1, pad_id=PAD)
        return total / count

    results = []
    for run in (loss, torch.compile(loss)):
        h.grad = head.weight.grad = None
        value = run(h)
        value.backward()
        results.append((value.detach(), h.grad, head.weight.grad))
    (eager, grad_h, grad_w), (compiled, compiled_h, compiled_w) = results
    assert grad_h.abs().max() > 0
    assert_close(compiled, eager, rtol=1e-12, atol=1e-12)
    assert_close(compiled_h, grad_h, rtol=1e-12, atol=1e-12)
    if kind == "head trains":
        assert_close(compiled_w, grad_w, rtol=1e-12, atol=1e-12)
