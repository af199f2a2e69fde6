"""benchmarks/finetune.py on a tiny LLaMA-shaped run: every contender trains in a process
of its own from the same adapters, activations recomputed, and vaswani's and peft's loss
curves agree."""

import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.step_time import _Products, products_alone, time_in_step
from tests.conftest import ROOT
from tests.training.fixtures import text_file
from tests.training.test_lora import _config
from vaswani.training.train import Launch, train

# the allocator's settings, which the peaks depend on and the result records: one, known
ALLOCATOR_AS_SET = {**{k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")
                       and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}, "MALLOC_ARENA_MAX": "2"}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_the_finetune_benchmark_races_vaswani_and_peft_on_the_same_steps(tmp_path):
    pytest.importorskip("peft")
    data = text_file(tmp_path / "text.txt")
    train(str(_config(tmp_path / "base.toml", data, max_steps=2)), [],
          out=str(tmp_path / "base"), launch=Launch(progress=False))
    out = tmp_path / "finetune.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.finetune", "--run",
                           str(tmp_path / "base"), "--work", str(tmp_path / "work"),
                           "--steps", "2", "--rounds", "1", "--length", "16", "--rank", "4",
                           "--checkpoint-activations", "--whole-logits", "--compiled",
                           "--json", str(out)],
                          cwd=ROOT, env=ALLOCATOR_AS_SET,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["results"]) == {"vaswani LoRA", "peft LoRA", "vaswani QLoRA int8",
                                      "vaswani QLoRA int4", "vaswani LoRA, whole logits",
                                      "vaswani QLoRA int4, whole logits",
                                      "vaswani LoRA, compiled", "peft LoRA, compiled"}
    for name, r in result["results"].items():
        assert len(r["losses"]) == 4 and r["tokens_per_s"] > 0, name
        assert 100 < r["training_peak_rss_mb"] <= r["peak_rss_mb"], name
        assert 0 < r["imported_rss_mb"] < r["training_peak_rss_mb"], name
        assert r["training_peak_above_imports_mb"] == \
            r["training_peak_rss_mb"] - r["imported_rss_mb"], name
        assert 0 < r["mfu"] < 1.5 and r["first_step_s"] > 0, name
    for name in ("vaswani LoRA", "vaswani QLoRA int4"):  # the chunked head: the same losses
        whole = result["results"][f"{name}, whole logits"]["losses"]
        assert result["results"][name]["losses"] == pytest.approx(whole, rel=1e-5), name
    assert result["loss_gap"] < 1e-3  # the same model, adapters and batches: the same losses
    # compiled, each trains as its eager self; the fastest of each compared
    assert result["compiled"] and set(result["compiled_loss_gaps"]) == {
        "vaswani LoRA, compiled", "peft LoRA, compiled"}
    assert all(g < 1e-4 for g in result["compiled_loss_gaps"].values())
    speeds = {who: max(r["tokens_per_s"] for name, r in result["results"].items()
                       if name.startswith(f"{who} LoRA")) for who in ("vaswani", "peft")}
    assert result["fastest_over_fastest"] == pytest.approx(speeds["vaswani"] / speeds["peft"])
    ours, theirs = (result["results"][f"{who} LoRA"] for who in ("vaswani", "peft"))
    assert ours["rounds_tokens_per_s"] == [ours["tokens_per_s"]]  # one round: its own
    assert result["round_ratios"] == [pytest.approx(ours["tokens_per_s"] / theirs["tokens_per_s"])]
    assert result["median_round_ratio"] == result["round_ratios"][0]
    assert "round by round" in done.stdout
    assert "vaswani LoRA, compiled / peft LoRA, compiled" in done.stdout
    for name in ("vaswani LoRA, compiled", "peft LoRA, compiled"):  # not counted, not clocked
        assert "products_s" not in result["results"][name], name
    for name in ("vaswani LoRA", "peft LoRA", "vaswani LoRA, whole logits"):  # float steps
        r = result["results"][name]
        assert r["products_s"] > 0, name  # timed apart from the step: no order between them
        seconds = [x["seconds"] for x in r["products"]]  # the costliest first, each named
        assert seconds == sorted(seconds, reverse=True) and sum(seconds) <= r["products_s"]
        assert all(x["op"].startswith(("aten.", "mkldnn.")) and x["times"] >= 1
                   and x["arguments"]
                   for x in r["products"]), name
        assert 0 < r["in_step_products_s"] < r["in_step_s"], name  # each operator clocked
        assert 0 < r["in_step_other_s"] < r["in_step_s"] - r["in_step_products_s"], name
        assert r["in_step_other"] and all(x["calls"] >= 1 for x in r["in_step_other"]), name
    assert "in_step_s" not in result["results"]["vaswani QLoRA int4"]
    assert "one step, each operator clocked" in done.stdout
    assert "products_s" not in result["results"]["vaswani QLoRA int4"]  # its kernels not counted
    assert result["ceiling_over_peft"] == pytest.approx(
        result["results"]["peft LoRA"]["step_s"] / result["results"]["vaswani LoRA"]["products_s"])
    assert "its matrix products alone" in done.stdout
    assert result["step_flops"] > 0 and "vaswani LoRA / peft LoRA" in done.stdout
    assert result["checkpoint_activations"] and "activations recomputed" in done.stdout
    assert result["allocator_environment"] == {"MALLOC_ARENA_MAX": "2"}  # as each child ran
    for name, r in result["results"].items():  # vaswani's under `vaswani train`'s malloc
        assert r.get("malloc_pinned") is (True if name.startswith("vaswani") else None), name


def test_a_steps_products_are_recorded_with_their_layouts_and_timed_alone():
    """The products (what FlopCounterMode counts: mm, addmm, bmm...) of a step, each with its
    arguments' shapes, strides and dtypes; the elementwise work beside them is not one."""
    a, w, bias = torch.randn(6, 4), torch.randn(5, 4), torch.randn(5)

    def step(_inputs):
        x = (a @ w.T).exp()  # a product by a transposed matrix, then elementwise work
        y = torch.addmm(bias, a, w.T).relu()
        y.addmm_(a, w.T)  # in place: FlopCounterMode does not count it, the record does
        return (x + y).sum() + (a @ w.T).sum()  # the first product again

    with _Products() as products:
        step(None)
    assert [(str(f.overloadpacket), layout) for f, layout in products.calls] == [
        ("aten.mm", (((torch.Size([6, 4]), (4, 1), torch.float32),
                      (torch.Size([4, 5]), (1, 4), torch.float32)), {})),
        ("aten.addmm", (((torch.Size([5]), (1,), torch.float32),
                         (torch.Size([6, 4]), (4, 1), torch.float32),
                         (torch.Size([4, 5]), (1, 4), torch.float32)), {})),
        ("aten.addmm_", (((torch.Size([6, 5]), (5, 1), torch.float32),
                          (torch.Size([6, 4]), (4, 1), torch.float32),
                          (torch.Size([4, 5]), (1, 4), torch.float32)), {})),
        ("aten.mm", (((torch.Size([6, 4]), (4, 1), torch.float32),
                      (torch.Size([4, 5]), (1, 4), torch.float32)), {}))]
    alone = products_alone(step, None)
    assert alone["products_s"] > 0
    assert {(x["op"], x["times"]) for x in alone["products"]} == \
        {("aten.mm", 2), ("aten.addmm", 1), ("aten.addmm_", 1)}  # the repeat counted twice
    assert alone["products_s"] == pytest.approx(sum(x["seconds"] for x in alone["products"]))
    addmm = next(x for x in alone["products"] if x["op"] == "aten.addmm")
    assert addmm["arguments"] == [[[5], [1]], [[6, 4], [4, 1]], [[4, 5], [1, 4]]]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")
def test_a_onednn_product_is_counted_and_recorded_as_an_mm_is():
    """vaswani's frozen weights multiply through oneDNN on AMD's CPUs (cpu/linear.py): the
    step's FLOPs (the MFU) and its products alone must count those as they count mm."""
    from torch.utils.flop_counter import FlopCounterMode

    x, w = torch.randn(2, 6, 4), torch.randn(5, 4)
    counts = []
    for product in (lambda: torch.nn.functional.linear(x, w),
                    lambda: torch.ops.mkldnn._linear_pointwise(x, w.T.contiguous().T, None,
                                                               "none", [], "")):
        with FlopCounterMode(display=False) as counter:
            product()
        counts.append(counter.get_total_flops())
    assert counts == [2 * 12 * 4 * 5] * 2
    alone = products_alone(lambda _: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [],
                                                                        ""), None)
    assert [(p["op"], p["times"]) for p in alone["products"]] == [("mkldnn._linear_pointwise", 1)]


def test_a_step_is_clocked_operator_by_operator_products_apart():
    """``time_in_step``: the products of a step (timed where they run) apart from the other
    operators, which are named with their calls; the clocks' sum within the step's time."""
    a, w = torch.randn(256, 256), torch.randn(256, 256)

    def step(_inputs):
        x = a @ w  # a product
        for _ in range(3):
            x = x.exp().mul(0.5)  # elementwise: three calls of each
        return torch.addmm(x, a, w).sum()  # a product again, then a sum

    clocked = time_in_step(step, None, repeats=2)
    ops = {x["op"]: x for x in clocked["in_step_other"]}
    assert ops["aten.exp"]["calls"] == ops["aten.mul"]["calls"] == 3
    assert ops["aten.sum"]["calls"] == 1 and not {"aten.mm", "aten.addmm"} & set(ops)
    assert clocked["in_step_other_s"] == pytest.approx(
        sum(x["seconds"] for x in clocked["in_step_other"]))  # under ten operators: all of them
    assert 0 < clocked["in_step_products_s"]
    assert clocked["in_step_products_s"] + clocked["in_step_other_s"] < clocked["in_step_s"]
