"""[finetune] method = "lora": a run that trains adapters on its init_from run's frozen
weights, keeps only them, resumes exactly, loads merged, and exports for peft."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from torch.testing import assert_close

import vaswani
from tests.training.fixtures import config, text_file
from vaswani import rundir
from vaswani.training.train import Launch, train

LLAMA = {"positional": "rope", "norm": "rmsnorm", "activation": "swiglu", "bias": False,
         "norm_first": True, "n_kv_heads": 2}
LORA = {"method": "lora", "rank": 4, "alpha": 8.0,
        "targets": ["q", "k", "v", "o", "gate", "up", "down"]}


def _config(path, data, base_dir=None, *, finetune=None, model=None, **train_options):
    cfg = config(path, "decoder", data, model={**LLAMA, **(model or {})},
                 data={"tokenizer": "bpe", "vocab_size": 300},
                 train={"max_steps": 6, "device": "cpu", "schedule": "constant", "warmup": 0,
                        "eval_every": 3, "save_every": 3, "lr": 1e-2,
                        **({"init_from": str(base_dir)} if base_dir else {}),
                        **train_options})
    if finetune:
        from vaswani.config import dump_toml
        cfg.write_text(cfg.read_text() + "\n" + dump_toml({"finetune": finetune}))
    return cfg


def _losses(run) -> dict[int, float]:
    """A run's training loss by step (metrics.jsonl)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A small LLaMA-shaped language model, trained a few steps: the frozen base."""
    folder = tmp_path_factory.mktemp("lora")
    data = text_file(folder / "text.txt")
    cfg = _config(folder / "base.toml", data, max_steps=8, lr=1e-3)
    train(str(cfg), [], out=str(folder / "base"), launch=Launch(progress=False))
    return folder / "base", data


@pytest.fixture(scope="module")
def lora_run(base, tmp_path_factory):
    base_dir, data = base
    folder = tmp_path_factory.mktemp("lora-run")
    cfg = _config(folder / "ft.toml", data, base_dir, finetune=LORA)
    train(str(cfg), [], out=str(folder / "ft"), launch=Launch(progress=False))
    return folder / "ft"


def test_a_lora_run_keeps_only_its_adapters_and_loads_merged_into_its_base(base, lora_run):
    base_dir = base[0]
    before = (base_dir / rundir.BEST).read_bytes()
    for path in (lora_run / rundir.BEST, lora_run / "last" / rundir.BEST):
        saved = load_file(str(path))
        assert saved and all(".lora_A." in n or ".lora_B." in n for n in saved), list(saved)
        assert len(saved) == 2 * 2 * 7  # A and B of 7 parts in each of 2 layers
    assert (base_dir / rundir.BEST).read_bytes() == before  # the base is read, never written
    run, plain = vaswani.load(lora_run), vaswani.load(base_dir)
    from vaswani.inference.finetuned import adapted

    unmerged = adapted(lora_run, run.config, lora_run / rundir.BEST, fast=False,
                       merge=False).eval()
    ids = torch.randint(0, 200, (2, 12))
    with torch.no_grad():
        ours, reference, base_logits = run.model(ids), unmerged(ids), plain.model(ids)
    assert_close(ours, reference, rtol=1e-5, atol=1e-5)  # merged = base + adapters
    assert (ours - base_logits).abs().max() > 1e-2  # and the adapters learned something
    assert run.generate("the", max_new_tokens=4, temperature=0) is not None


def test_a_lora_run_resumes_exactly(base, tmp_path):
    base_dir, data = base
    straight = _config(tmp_path / "a.toml", data, base_dir, finetune=LORA)
    train(str(straight), [], out=str(tmp_path / "a"), launch=Launch(progress=False))
    half = _config(tmp_path / "b.toml", data, base_dir, finetune=LORA, max_steps=3,
                   schedule_steps=6)
    train(str(half), [], out=str(tmp_path / "b"), launch=Launch(progress=False))
    train(None, ["train.max_steps=6"], resume=str(tmp_path / "b"), launch=Launch(progress=False))
    a = load_file(str(tmp_path / "a" / "last" / rundir.BEST))
    b = load_file(str(tmp_path / "b" / "last" / rundir.BEST))
    assert a.keys() == b.keys()
    for name in a:
        assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
    with pytest.raises(ValueError, match=r"finetune\.rank \(4 -> 2\)"):
        train(None, ["train.max_steps=9", "finetune.rank=2"], resume=str(tmp_path / "b"),
              launch=Launch(progress=False))


def test_a_compiled_lora_run_trains_as_the_eager_one(base, lora_run, tmp_path, monkeypatch):
    """``[train] compile = true`` on a CPU: the same losses and adapters as the eager run, the
    vocabulary projection and the loss still together chunk by chunk (never the whole
    logits through the compiled criterion)."""
    from vaswani.models import losses as loss_module

    def whole_logits(*args, **kwargs):
        raise AssertionError("a CPU language model's compiled step made its whole logits")

    monkeypatch.setattr(loss_module, "compiled_smoothed_cross_entropy", whole_logits)
    base_dir, data = base
    cfg = _config(tmp_path / "c.toml", data, base_dir, finetune=LORA, compile=True)
    train(str(cfg), [], out=str(tmp_path / "c"), launch=Launch(progress=False))

    eager, compiled = _losses(lora_run), _losses(tmp_path / "c")
    assert eager.keys() == compiled.keys() and len(eager) == 6
    for step in eager:
        assert compiled[step] == pytest.approx(eager[step], rel=1e-4)
    a, b = load_file(str(lora_run / rundir.BEST)), load_file(str(tmp_path / "c" / rundir.BEST))
    assert a.keys() == b.keys()  # no "_orig_mod." prefix
    for name in a:
        assert_close(b[name], a[name], rtol=1e-3, atol=1e-4, msg=name)


def test_lora_settings_that_cannot_work_are_refused_by_name(base, tmp_path):
    base_dir, data = base
    with pytest.raises(ValueError, match="set \\[train\\] init_from"):
        train(str(_config(tmp_path / "a.toml", data, finetune=LORA)), [],
              out=str(tmp_path / "a"), launch=Launch(progress=False))
    with pytest.raises(ValueError, match=r'quantize = "int4" \(QLoRA\) .* not int8/int4'):
        train(str(_config(tmp_path / "b.toml", data, base_dir,
                          finetune={**LORA, "quantize": "int4"}, parallel="fsdp")), [],
              out=str(tmp_path / "b"), launch=Launch(progress=False))
    with pytest.raises(ValueError, match="targets"):
        train(str(_config(tmp_path / "c.toml", data, base_dir,
                          finetune={**LORA, "targets": ["query"]})), [],
              out=str(tmp_path / "c"), launch=Launch(progress=False))
    assert not any((tmp_path / x).exists() for x in "abc")


def test_a_moved_base_is_named_when_the_run_loads(base, lora_run, tmp_path):
    moved = tmp_path / "ft"
    shutil.copytree(lora_run, moved)
    run = vaswani.load(moved)  # the base is found where init_from says (an absolute path)
    assert run.config.train.init_from == str(base[0].resolve())
    config_text = (moved / rundir.CONFIG).read_text()
    (moved / rundir.CONFIG).write_text(config_text.replace(str(base[0].resolve()),
                                                           str(tmp_path / "gone")))
    with pytest.raises(FileNotFoundError, match="put that run back"):
        vaswani.load(moved)


def test_peft_loads_the_exported_adapters_with_vaswanis_logits_and_gradients(base, lora_run,
                                                                            tmp_path):
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from vaswani.export import ExportError, export
    from vaswani.export.peft import peft_name
    from vaswani.inference.finetuned import adapted

    out = export(lora_run, "hf", tmp_path / "hf")
    theirs = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(out), out / "adapter",
        is_trainable=True).eval()
    run = vaswani.load(lora_run)
    ids = torch.randint(0, 200, (2, 12))
    with torch.no_grad(), theirs.disable_adapter():  # the base alone differs
        assert (theirs(ids).logits - run.model(ids)).abs().max() > 1e-2
    with torch.no_grad():
        assert_close(theirs(ids).logits, run.model(ids), rtol=1e-4, atol=1e-4)
    # gradients by each adapter, in float64: vaswani's (unmerged) and peft's
    ours = adapted(lora_run, run.config, lora_run / rundir.BEST, fast=False,
                   merge=False).double()
    theirs = theirs.double()
    weight = torch.randn(2, 12, ours.config.vocab_size, dtype=torch.float64)
    (ours(ids) * weight).sum().backward()
    (theirs(ids).logits * weight).sum().backward()
    named = dict(theirs.named_parameters())
    grads = {peft_name(n).replace(".weight", ".default.weight"): p.grad
             for n, p in ours.named_parameters() if p.requires_grad}
    assert len(grads) == 28 and set(grads) <= set(named)
    for name, grad in grads.items():  # HF's rotary angles are float32 even in a float64
        scale = grad.abs().max()  # model (LlamaRotaryEmbedding): equal within 1e-6 of the
        assert scale > 0, name  # largest element, not to float64's last digits
        assert (grad - named[name].grad).abs().max() <= 1e-6 * scale, name
    # --merge: the merged model, which transformers runs alone
    merged = export(lora_run, "hf", tmp_path / "merged", merge=True)
    assert not (merged / "adapter").exists()
    alone = transformers.AutoModelForCausalLM.from_pretrained(merged).eval()
    with torch.no_grad():
        assert_close(alone(ids).logits, run.model(ids), rtol=1e-5, atol=1e-5)
    with pytest.raises(ExportError, match="holds none"):
        export(base[0], "hf", tmp_path / "x", merge=True)


def test_a_quantized_lora_run_carries_its_adapters(base, lora_run):
    ids = torch.randint(0, 200, (2, 12))
    with torch.no_grad():
        int8 = vaswani.load(lora_run, quantize="int8").model(ids)
        adapted_float = vaswani.load(lora_run).model(ids)
        base_float = vaswani.load(base[0]).model(ids)
    # int8 rounding moves the logits a little; without the adapters they would move as far
    # as the base model's are from the adapted ones
    assert (int8 - adapted_float).abs().max() < (base_float - adapted_float).abs().max() / 4


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_qlora_trains_adapters_over_quantized_frozen_weights(base, tmp_path, quantize,
                                                             monkeypatch):
    from vaswani.checkpoint import quantized as quantized_load
    from vaswani.cpu import quantized
    from vaswani.nn.lora import LoRA

    seen = []  # the model the adapters were added to
    real = quantized_load.load_frozen
    monkeypatch.setattr("vaswani.training.loop.load_frozen",
                        lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    base_dir, data = base
    cfg = _config(tmp_path / "q.toml", data, base_dir, finetune={**LORA, "quantize": quantize})
    train(str(cfg), [], out=str(tmp_path / "q"), launch=Launch(progress=False))
    bases = [m.base for m in seen[0].modules() if isinstance(m, LoRA)]
    assert bases and all(isinstance(b, quantized.WeightOnlyLinear) for b in bases)
    assert {b.bits for b in bases} == {8 if quantize == "int8" else 4}
    saved = load_file(str(tmp_path / "q" / rundir.BEST))
    assert len(saved) == 28 and all(t.abs().max() > 0 for t in saved.values())  # B moved too
    run, plain = vaswani.load(tmp_path / "q"), vaswani.load(base_dir)
    ids = torch.randint(0, 200, (2, 12))
    with torch.no_grad():
        assert (run.model(ids) - plain.model(ids)).abs().max() > 1e-2
    with pytest.raises(ValueError, match="QLoRA's: it needs method"):
        train(str(_config(tmp_path / "x.toml", data, base_dir,
                          finetune={"quantize": quantize})), [], out=str(tmp_path / "x"),
              launch=Launch(progress=False))


def test_a_compiled_qlora_run_trains_as_the_eager_one(base, tmp_path):
    """``[train] compile = true`` over int4 frozen weights: the same losses as eagerly."""
    base_dir, data = base
    runs = {}
    for compiled in (False, True):
        cfg = _config(tmp_path / f"{compiled}.toml", data, base_dir,
                      finetune={**LORA, "quantize": "int4"}, compile=compiled)
        train(str(cfg), [], out=str(tmp_path / str(compiled)), launch=Launch(progress=False))
        runs[compiled] = _losses(tmp_path / str(compiled))
    assert runs[False].keys() == runs[True].keys() and len(runs[False]) == 6
    for step, loss in runs[False].items():
        assert runs[True][step] == pytest.approx(loss, rel=1e-4)


def test_a_base_whose_weights_changed_is_refused(base, lora_run, tmp_path):
    """The adapters were trained on one model: another model at the same path (retrained,
    replaced) is refused by name when the run loads or resumes, not silently adapted."""
    from vaswani.checkpoint import read_weights, save_weights

    base_copy = tmp_path / "base"
    shutil.copytree(base[0], base_copy)
    run = tmp_path / "ft"
    shutil.copytree(lora_run, run)
    config = (run / rundir.CONFIG).read_text()
    (run / rundir.CONFIG).write_text(config.replace(str(base[0].resolve()), str(base_copy)))
    assert 'base_sha256 = "' in config
    vaswani.load(run)  # the same weights in another place: accepted
    tensors = read_weights(base_copy / rundir.BEST)
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1  # another model now
    save_weights(tensors, base_copy / rundir.BEST)
    with pytest.raises(ValueError, match="have changed since"):
        vaswani.load(run)
    with pytest.raises(ValueError, match="have changed since"):
        train(None, ["train.max_steps=9"], resume=str(run), launch=Launch(progress=False))


@pytest.mark.parametrize("recompute", [False, True])
def test_two_ddp_processes_train_the_adapters_as_one_process_on_the_combined_batch(
        base, tmp_path, recompute):
    """DDP over a LoRA run: only the adapters are in the reducer (the frozen base has no
    gradients to reduce), and two processes equal one on the combined batch; with the
    layers recomputed too (checkpoint's reentrant form over a frozen embedding's output)."""
    from tests.training.fixtures import train_in_one_and_two_processes
    from tests.training.test_trainer import losses

    base_dir, data = base
    cfg = _config(tmp_path / "ft.toml", data, base_dir, finetune=LORA, lr=1e-3,
                  eval_every=6, save_every=6, checkpoint_activations=recompute)
    train_in_one_and_two_processes(cfg, tmp_path)
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert a and a.keys() == b.keys()
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-5, (step, a[step], b[step])
    wa, wb = (load_file(str(tmp_path / d / rundir.BEST)) for d in ("one", "two"))
    assert wa.keys() == wb.keys() and all(".lora_" in n for n in wa)
    for name in wa:
        assert_close(wa[name], wb[name], rtol=0, atol=1e-5, msg=name)


def test_fsdp_shards_a_lora_run_that_trains_and_resumes_as_one_process(base, tmp_path):
    """parallel = "fsdp": the frozen weights and the adapters sliced over two processes for
    three steps, then resumed by one (DCP re-slices): the losses, evaluations and adapters of
    one unsharded process, and checkpoints that hold the adapters alone (their optimizer
    state too, in the sharded folder), never the base run's weights."""
    import torch.distributed.checkpoint as dcp

    from tests.training.test_sharded import vaswani as run

    base_dir, data = base
    cfg = _config(tmp_path / "ft.toml", data, base_dir, finetune=LORA, lr=1e-3)
    train(str(cfg), [], out=str(tmp_path / "one"), launch=Launch(progress=False))
    sharded = tmp_path / "fsdp"
    run("train", str(cfg), "--out", str(sharded), "--set", "train.parallel=fsdp",
        "--set", "train.max_steps=3", nproc=2)
    saved = dcp.FileSystemReader(str(sharded / "last/sharded")).read_metadata()
    names = list(saved.state_dict_metadata)
    assert any(n.startswith("model.") for n in names)
    assert all(".lora_" in n for n in names if n.startswith(("model.", "optimizer.state.")))
    run("train", "--resume", str(sharded), "--set", "train.max_steps=6")  # one process

    def evaluations(run_dir):
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["valid_loss"] for r in rows if "valid_loss" in r}

    for read in (_losses, evaluations):
        a, b = read(tmp_path / "one"), read(sharded)
        assert a and a.keys() == b.keys()
        for step in a:
            assert abs(a[step] - b[step]) <= 1e-5, (read.__name__, step, a[step], b[step])
    for which in (rundir.BEST, f"last/{rundir.BEST}"):
        wa, wb = (load_file(str(d / which)) for d in (tmp_path / "one", sharded))
        assert wa.keys() == wb.keys() and all(".lora_" in n for n in wa)
        for name in wa:
            assert_close(wb[name], wa[name], rtol=0, atol=1e-5, msg=name)

