import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from vaswani.models import losses
from vaswani.models.losses import (
    compiled_smoothed_cross_entropy,
    fused_smoothed_cross_entropy,
    reference_smoothed_cross_entropy,
    smoothed_cross_entropy,
)

PAD = 0
BOTH = pytest.mark.parametrize("loss_fn", [smoothed_cross_entropy,
                                           reference_smoothed_cross_entropy,
                                           fused_smoothed_cross_entropy],
                               ids=["chunked", "reference", "fused"])


def independent_smoothed_loss(logits, target, eps, pad_id):
    """Build the target distribution explicitly and take the cross-entropy against it."""
    V = logits.size(-1)
    dist = torch.full_like(logits, eps / (V - 2))
    dist[:, pad_id] = 0.0
    dist.scatter_(1, target[:, None], 1.0 - eps)
    keep = target != pad_id
    per_token = -(dist * logits.log_softmax(-1)).sum(-1)
    return per_token[keep].sum(), keep.sum()


@pytest.mark.parametrize("eps", [0.1, 0.3])
@BOTH
def test_label_smoothing_against_an_explicit_distribution_with_padding(eps, loss_fn):
    logits = torch.randn(12, 9, dtype=torch.float64)
    target = torch.randint(1, 9, (12,))
    target[[2, 5, 11]] = PAD
    loss, nll, count = loss_fn(logits, target, smoothing=eps, pad_id=PAD)
    expected, expected_count = independent_smoothed_loss(logits, target, eps, PAD)
    assert_close(loss, expected)
    assert count == expected_count == 9
    # The NLL beside it is unsmoothed and also ignores padding.
    assert_close(nll, F.cross_entropy(logits, target, ignore_index=PAD, reduction="sum"))


@BOTH
def test_no_smoothing_is_plain_cross_entropy(loss_fn):
    logits = torch.randn(10, 7)
    target = torch.randint(0, 7, (10,))
    loss, nll, count = loss_fn(logits, target, pad_id=None)
    assert_close(loss, F.cross_entropy(logits, target, reduction="sum"))
    assert_close(loss, nll)
    assert count == 10


@BOTH
def test_smoothing_puts_no_mass_on_padding(loss_fn):
    """Raising the pad logit must not change the smoothed loss of a real target beyond the
    softmax normalisation: torch's built-in label_smoothing, which spreads eps over pad too,
    gives a different number."""
    logits = torch.randn(4, 6, dtype=torch.float64)
    target = torch.tensor([1, 2, 3, 4])
    ours, _, _ = loss_fn(logits, target, smoothing=0.1, pad_id=PAD)
    torch_builtin = F.cross_entropy(logits, target, label_smoothing=0.1, reduction="sum")
    assert not torch.allclose(ours, torch_builtin)


@BOTH
def test_classification_smoothing_without_pad_spreads_over_all_other_classes(loss_fn):
    logits = torch.randn(5, 4, dtype=torch.float64)
    target = torch.tensor([0, 1, 2, 3, 0])
    eps = 0.2
    loss, _, count = loss_fn(logits, target, smoothing=eps)
    dist = torch.full_like(logits, eps / 3).scatter_(1, target[:, None], 1 - eps)
    expected = -(dist * logits.log_softmax(-1)).sum()
    assert_close(loss, expected)
    assert count == 5


@pytest.mark.parametrize("pad_id", [PAD, None])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_chunked_loss_and_gradients_equal_the_reference(monkeypatch, eps, pad_id):
    """Values and gradients of both outputs, across several row chunks (float64)."""
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 3 * 11)  # 3 rows per chunk, 7 chunks
    torch.manual_seed(0)
    logits = torch.randn(20, 11, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 11, (20,))
    target[[0, 7, 19]] = 0  # padding when pad_id == 0, a real class otherwise
    w_loss, w_nll = torch.rand(2, dtype=torch.float64)  # weights of the two outputs
    results = []
    for fn in (smoothed_cross_entropy, reference_smoothed_cross_entropy):
        loss, nll, count = fn(logits, target, smoothing=eps, pad_id=pad_id)
        (grad,) = torch.autograd.grad(w_loss * loss + w_nll * nll, logits)
        results.append((loss, nll, count, grad))
    for ours, ref in zip(*results, strict=True):
        assert_close(ours, ref)


def test_chunked_loss_passes_gradcheck():
    logits = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([1, 0, 4, 2, 0, 3])
    assert torch.autograd.gradcheck(
        lambda x: smoothed_cross_entropy(x, target, smoothing=0.1, pad_id=PAD)[:2], (logits,))


def test_chunked_loss_keeps_bf16_gradients_and_matches_fp32():
    """bf16 logits: the gradient comes back in bf16 (no fp32 (N, V) buffer is returned), and
    both loss and gradient agree with the fp32 reference to bf16 precision."""
    torch.manual_seed(0)
    x32 = torch.randn(64, 300) * 3
    target = torch.randint(0, 300, (64,))
    x16 = x32.bfloat16().requires_grad_()
    loss16, _, _ = smoothed_cross_entropy(x16, target, smoothing=0.1, pad_id=PAD)
    loss16.backward()
    assert loss16.dtype == torch.float32 and x16.grad.dtype == torch.bfloat16
    x_ref = x16.detach().float().requires_grad_()
    loss32, _, _ = reference_smoothed_cross_entropy(x_ref, target, smoothing=0.1, pad_id=PAD)
    loss32.backward()
    assert_close(loss16, loss32, rtol=1e-5, atol=1e-4)
    assert_close(x16.grad.float(), x_ref.grad, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("N", [0, 1, 2, 23, 85, 171, 512, 16_384])
@pytest.mark.parametrize("V, elements", [(17, 5 * 17), (49_152, 1 << 22), (32_000, 1 << 20)])
def test_chunks_cover_the_rows_in_equal_slices(N, V, elements):
    """Every row once, in order, in slices of one size but the last: no short last chunk
    whose product by a head reads all its weights for a row or two."""
    from vaswani.models.losses import _chunks

    rows = list(_chunks(N, V, torch.device("cpu"), elements))
    assert [i for r in rows for i in range(N)[r]] == list(range(N))
    sizes = [r.stop - r.start for r in rows]
    nominal = max(1, elements // V)
    assert all(s == sizes[0] for s in sizes[:-1])
    assert all(s <= 1.5 * nominal + 1 for s in sizes)  # about ``elements`` logits a chunk
    if N >= nominal:
        assert min(sizes) >= nominal // 2


def test_512_rows_of_smollm2s_head_are_six_chunks_not_seven():
    from vaswani.models.head_loss import HEAD_CHUNK_ELEMENTS
    from vaswani.models.losses import _chunks

    sizes = [r.stop - r.start for r in _chunks(512, 49_152, torch.device("cpu"),
                                                HEAD_CHUNK_ELEMENTS)]
    assert sizes == [86] * 5 + [82]


def test_off_the_cpu_the_loss_is_the_fused_kernels_not_a_chunk_loop(monkeypatch):
    """500 small chunks made the loss 23x slower than F.cross_entropy on an H200 (kernel
    launches): off the CPU, smoothed_cross_entropy is fused_smoothed_cross_entropy (here on
    the meta device, which any machine has); a CPU keeps its cache-sized chunks."""
    from vaswani.models.losses import _chunks

    assert len(list(_chunks(16_384, 32_000, torch.device("cpu")))) == 512

    def chunked(*args):
        raise AssertionError("the chunk loop ran off the CPU")
    monkeypatch.setattr(losses._ChunkedSmoothedCE, "apply", chunked)
    logits = torch.empty(16_384, 32_000, device="meta", dtype=torch.bfloat16)
    target = torch.zeros(16_384, dtype=torch.long, device="meta")
    loss, nll, count = smoothed_cross_entropy(logits, target, smoothing=0.1, pad_id=0)
    assert loss.device.type == "meta" and loss.shape == ()


# (dtype, tolerance of the values, of the gradients): bf16 logits are upcast first
# (F.cross_entropy's per-row bf16 losses would round each by up to 2^-8)
PRECISIONS = [(torch.bfloat16, (1e-6, 1e-5), (1e-2, 1e-2)),
              (torch.float64, (1e-12, 1e-12), (1e-10, 1e-12))]


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("pad_id", [0, None])
@pytest.mark.parametrize("dtype, values, grads", PRECISIONS, ids=["bf16", "fp64"])
@pytest.mark.parametrize("mixed", [True, False], ids=["one-pass", "through-fp32"])
def test_the_fused_loss_equals_the_reference_in_value_and_gradient(eps, pad_id, dtype, values,
                                                                   grads, mixed, device,
                                                                   monkeypatch):
    """On the test device, and through both ways its backward can end: the log-softmax
    backward writing the logits' dtype itself, or in float32 and then cast (CUDA's kernel
    refuses bfloat16 logits with float32 gradients: the loss's backward failed on an H200)."""
    if not mixed:
        monkeypatch.setattr(losses, "_mixed_backward", lambda device, dtype: False)
    torch.manual_seed(0)
    x = (torch.randn(64, 41, dtype=torch.float64) * 3).to(dtype).to(device).requires_grad_()
    y = torch.randint(0, 41, (64,)).to(device)
    if pad_id is not None:
        y[::5] = pad_id
    want = reference_smoothed_cross_entropy(x, y, smoothing=eps, pad_id=pad_id)
    got = fused_smoothed_cross_entropy(x, y, smoothing=eps, pad_id=pad_id)
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, rtol=values[0], atol=values[1])
    for weights in ((1.0, 0.0), (0.0, 1.0), (0.7, 0.3)):  # through each of the two sums
        g1, = torch.autograd.grad(weights[0] * got[0] + weights[1] * got[1], x,
                                  retain_graph=True)
        g2, = torch.autograd.grad(weights[0] * want[0] + weights[1] * want[1], x,
                                  retain_graph=True)
        assert_close(g1, g2, rtol=grads[0], atol=grads[1])


def test_the_loss_equals_the_reference_on_the_test_device(device):
    from vaswani.models.losses import reference_smoothed_cross_entropy, smoothed_cross_entropy

    logits = torch.randn(300, 50, dtype=torch.float64, device=device, requires_grad=True)
    target = torch.randint(0, 50, (300,), device=device)
    target[::7] = 0
    got = smoothed_cross_entropy(logits, target, smoothing=0.1, pad_id=0)
    want = reference_smoothed_cross_entropy(logits, target, smoothing=0.1, pad_id=0)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    g1, = torch.autograd.grad(got[0] + 0.5 * got[1], logits)
    g2, = torch.autograd.grad(want[0] + 0.5 * want[1], logits)
    torch.testing.assert_close(g1, g2)


def test_the_compiled_loss_is_the_reference_for_any_number_of_rows(device):
    """The criterion of a compiled training step: the reference compiled with dynamic shapes
    (a batch's token count varies), with the reference's values and gradients, in float32
    and from bf16."""
    torch.manual_seed(0)
    for rows, dtype, pad_id in [(90, torch.float32, 0), (37, torch.float32, None),
                                (64, torch.bfloat16, 0)]:
        x = (torch.randn(rows, 41, device=device) * 3).to(dtype).requires_grad_()
        y = torch.randint(0, 41, (rows,), device=device)
        if pad_id is not None:
            y[::5] = pad_id
        got = compiled_smoothed_cross_entropy(x, y, smoothing=0.1, pad_id=pad_id)
        want = reference_smoothed_cross_entropy(x, y, smoothing=0.1, pad_id=pad_id)
        for a, b in zip(got, want, strict=True):
            assert_close(a, b, rtol=1e-5, atol=1e-4)
        g1, = torch.autograd.grad(got[0] + 0.5 * got[1], x)
        g2, = torch.autograd.grad(want[0] + 0.5 * want[1], x)
        assert_close(g1, g2, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-4)


VIEWS = {"detach", "select", "slice", "view", "_unsafe_view", "expand", "t", "transpose",
         "unsqueeze", "squeeze", "alias", "as_strided", "permute"}  # move nothing
ALLOCATE = {"empty_like", "empty", "new_empty", "empty_strided"}  # write nothing
INDEXED = {"gather", "nll_loss_forward", "scatter_", "scatter", "nll_loss_backward"}  # read or
# write the indexed elements only: their index, source and output, never their whole input


class Traffic(torch.utils._python_dispatch.TorchDispatchMode):
    """Bytes the aten operations read and write, in multiples of ``unit`` (the logits in
    float32): a tensor at most its storage's size (an expanded row is not a matrix's worth),
    an in-place result once, views and allocations nothing, and an indexed read or write
    only its index, source and output."""

    def __init__(self, unit: int):
        super().__init__()
        self.unit, self.moved = unit, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in VIEWS or name in ALLOCATE:
            return out
        inputs = [t for t in torch.utils._pytree.tree_leaves((args, kwargs or {}))
                  if isinstance(t, torch.Tensor)]
        if name in INDEXED:
            inputs = inputs[1:] if name != "nll_loss_backward" else inputs[2:]
        outputs = [t for t in torch.utils._pytree.tree_leaves(out)
                   if isinstance(t, torch.Tensor) and not any(t is i for i in inputs)]
        if name.endswith("_") and name in INDEXED:
            outputs = []  # scatter_ writes its source's worth into its first input
        self.moved += sum(min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
                          for t in inputs + outputs)
        return out

    @property
    def copies(self) -> float:
        return self.moved / self.unit


@pytest.mark.parametrize("mixed", [True, False], ids=["one-pass", "through-fp32"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_fused_loss_moves_less_than_f_cross_entropy(dtype, mixed, monkeypatch):
    """Issue 85: the loss off the CPU was two F.cross_entropy calls on a float32 copy (~72
    logit-sized copies forward and backward). Now: no more than ``F.cross_entropy`` with label
    smoothing on the logits upcast as autocast upcasts them (counted with a dispatch mode:
    bytes in and out of every aten operation, forward and backward)."""
    N, V = 512, 1000
    if not mixed:  # as on CUDA with bf16 logits: the backward's float32 result, then cast
        monkeypatch.setattr(losses, "_mixed_backward", lambda device, dtype: False)

    def moved(loss_fn):
        x = torch.randn(N, V, dtype=dtype).requires_grad_()
        y = torch.randint(1, V, (N,))
        y[::7] = PAD
        with Traffic(unit=N * V * 4) as traffic:
            loss_fn(x, y).backward()
        return traffic.copies

    ours = moved(lambda x, y: fused_smoothed_cross_entropy(x, y, smoothing=0.1,
                                                           pad_id=PAD)[0])
    theirs = moved(lambda x, y: F.cross_entropy(x.float(), y, label_smoothing=0.1,
                                                ignore_index=PAD, reduction="sum"))
    assert ours <= theirs, (ours, theirs)
