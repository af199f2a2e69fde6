"""What every architecture added to vaswani/architectures/ is held to, against
``transformers`` as its users run it, on a random model of the architecture's own class:

* ``vaswani import hf`` of the folder ``save_pretrained`` writes gives the same logits in
  float64 (1e-6), cached greedy tokens equal ``generate``'s, and the engine (what
  ``generate``, ``serve`` and the Python API decode with) gives the plain loop's tokens;
* ``vaswani export --format hf`` writes the same class back, with the same logits;
* a GGUF file written as llama.cpp's converter writes the architecture (checked by
  ``transformers``' own GGUF reader) imports with the same logits;
* int8 and int4 weights as read equal quantizing the float model, and stay near it;
* LoRA adapters attach to its projections and their gradients flow.

An architecture's test file builds its model and calls these (tests/architectures/
test_qwen3.py is one).
"""

import json

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import vaswani
from tests.pretrained.test_hf_import import CHAT, byte_level_tokenizer
from vaswani.architectures import named
from vaswani.cli import main
from vaswani.config import DecodeConfig
from vaswani.generation import generate
from vaswani.pretrained.importer import import_checkpoint

VOCAB = byte_level_tokenizer().get_vocab_size()
# a tiny model's sizes under transformers' names (grouped-query: 6 heads share 2 k/v heads)
SIZES = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
             num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
             rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def vocabulary():
    """A GGUF file's byte-level vocabulary whose merges cross where the pre-tokenizers
    differ: digits (GPT-2 keeps a run whole, LLaMA 3 cuts it in threes, Qwen2 in ones),
    "'S" (a contraction only where case is ignored), a space before a digit."""
    from tokenizers import pre_tokenizers

    tokens = ["<|endoftext|>", *sorted(pre_tokenizers.ByteLevel.alphabet())]
    merges = ["1 2", "12 3", "123 4", "3 4", "' S", "' s", "Ġ 1", "a b", "Ġ ab", "Ċ Ċ", "Ġ Ġ"]
    tokens += [m.replace(" ", "") for m in merges]
    return tokens, merges


def random_model(transformers, cls: str, config):
    """A ``transformers`` model of class ``cls``, seeded, its norms and biases moved away
    from their 1/0 init so that they are tested."""
    torch.manual_seed(0)
    model = getattr(transformers, cls)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def imported(model, root):
    """``model`` saved by ``save_pretrained`` with a byte-level tokenizer and a chat
    template, then imported: (folder, run directory)."""
    folder = root / "hf"
    model.save_pretrained(folder, safe_serialization=True)
    byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "chat_template": CHAT}))
    return folder, import_checkpoint("hf", str(folder), root / "run", root / "cache")


def logits_equal(model, run_dir, architecture: str):
    run = vaswani.load(run_dir)
    assert run.config.model.architecture == architecture
    ids = torch.randint(1, VOCAB, (2, 40))
    with torch.no_grad():
        expected = model.double()(input_ids=ids).logits
        got = run.model.double()(ids, mask=torch.ones_like(ids, dtype=torch.bool))
    model.float()
    assert_close(got, expected, atol=1e-6, rtol=1e-6)


def greedy_tokens_equal(model, run_dir):
    """transformers' cached greedy decoding, vaswani's plain loop (float64) and vaswani's
    engine over two rows of unlike lengths (float32) give the same tokens."""
    prompt = [17, 45, 101, 8, 60]
    with torch.no_grad():
        out = model.double().generate(torch.tensor([prompt]), max_new_tokens=40,
                                      do_sample=False, pad_token_id=0, eos_token_id=None,
                                      attention_mask=torch.ones(1, 5, dtype=torch.long))
    model.float()
    run = vaswani.load(run_dir)
    assert generate(run.model.double(), prompt, max_new_tokens=40, temperature=0,
                    bos_id=0) == out[0].tolist()[5:]
    run = vaswani.load(run_dir)
    prompts = [prompt, [9, 33, 70, 12, 5, 88, 140, 61, 7, 200, 3]]
    completions = [run.completion("", DecodeConfig(temperature=0.0, max_new_tokens=30),
                                  ids=p) for p in prompts]
    run.engine_for(2).run([c.request for c in completions])
    for p, completion in zip(prompts, completions, strict=True):
        assert completion.request.output == generate(run.model, p, max_new_tokens=30,
                                                     temperature=0, bos_id=0)


def exports_back(transformers, model, run_dir, out):
    assert main(["export", str(run_dir), "--format", "hf", "--out", str(out)]) == 0
    cls = type(model).__name__
    assert json.loads((out / "config.json").read_text())["architectures"] == [cls]
    back = transformers.AutoModelForCausalLM.from_pretrained(out).double().eval()
    if getattr(model.config, "_experts_implementation", None):  # float64 needs "eager"
        back.config._experts_implementation = model.config._experts_implementation
    assert type(back).__name__ == cls
    ids = torch.randint(1, VOCAB, (1, 30))
    with torch.no_grad():
        assert_close(back(input_ids=ids).logits, model.double()(input_ids=ids).logits,
                     atol=1e-6, rtol=1e-6)
    model.float()


def write_gguf(gguf, model, arch: str, path, pre: str = "default", rotated: int | None = None):
    """``model`` as llama.cpp's converter writes an ``arch`` file: its block tensors under
    the names the architecture's GGUF record reads, q and k rows permuted into interleaved
    rotary pairs where it says (``LlamaModel.permute``); ``pre``: the tokenizer's split,
    ``rotated``: the rotary dimensions it claims (the head width)."""
    record = named(arch).gguf
    names = {hf: ours for ours, hf in record.blocks.items()}
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    tokens, merges = vocabulary()
    w = gguf.GGUFWriter(str(path), record.name or arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(rotated or head_dim)
    if getattr(c, "sliding_window", None):
        w.add_sliding_window(c.sliding_window)
    if getattr(c, "num_experts", None):
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (len(tokens) - 1))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    top = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        t = t.float().numpy()
        if name in top:
            w.add_tensor(top[name], t)
            continue
        block, rest = name.removeprefix("model.layers.").split(".", 1)
        if rest.startswith("mlp.experts."):  # stacked: gate and up apart, (E, I, D) each
            parts = dict(zip(("ffn_gate_exps", "ffn_up_exps"), np.split(t, 2, axis=1),
                             strict=True)) if rest.endswith("gate_up_proj") else \
                {"ffn_down_exps": t}
            for kind, part in parts.items():
                w.add_tensor(f"blk.{block}.{kind}.weight", np.ascontiguousarray(part))
            continue
        module, suffix = rest.rsplit(".", 1)
        heads = {"self_attn.q_proj": c.num_attention_heads,
                 "self_attn.k_proj": c.num_key_value_heads}.get(module)
        if record.permuted and heads:
            t = t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2) \
                .reshape(t.shape)
        w.add_tensor(f"blk.{block}.{names[module]}.{suffix}", t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_imports(transformers, gguf, like, arch: str, root):
    """A GGUF file of a model like ``like`` (its class and config, with the file's
    vocabulary), as llama.cpp writes it: transformers' own reading of it gives the model's
    logits (so the file is written as the converter writes it), and so does vaswani's
    import."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = type(like.config).from_dict({**like.config.to_dict(),
                                          "vocab_size": len(vocabulary()[0])})
    model = random_model(transformers, type(like).__name__, config)
    path = write_gguf(gguf, model, arch, root / "m.gguf")
    ids = torch.randint(1, len(vocabulary()[0]), (2, 24))
    fresh = type(model)(model.config).eval()
    read = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=fresh)["tensors"]
    missing, unexpected = fresh.load_state_dict(read, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    run = vaswani.load(import_checkpoint("gguf", str(path), root / "run", root / "cache"))
    assert run.config.model.architecture == arch
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        assert_close(fresh(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)
        got = run.model(ids, mask=torch.ones_like(ids, dtype=torch.bool))
    assert_close(got, expected, atol=1e-5, rtol=1e-5)


def quantized_near(run_dir):
    """int8 and int4 weights as read are the float model's quantized, and its logits stay
    near the float model's (relative error under 5% and 20%: a tiny random model's int4
    groups span whole rows of 48)."""
    from vaswani.cpu.quantized import quantize_linears

    ids = torch.randint(1, VOCAB, (2, 20))
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        exact = vaswani.load(run_dir).model(ids, mask=mask)
        for kind in ("int8", "int4"):
            streamed = vaswani.load(run_dir, quantize=kind).model
            whole = quantize_linears(vaswani.load(run_dir).model, kind, weight_only=True)
            got = streamed(ids, mask=mask)
            assert torch.equal(got, whole(ids, mask=mask)), kind
            error = ((got - exact).norm() / exact.norm()).item()
            assert error < {"int8": 0.05, "int4": 0.2}[kind], (kind, error)


def lora_steps(run_dir, root, targets) -> None:
    """Two LoRA steps (rank 4, ``targets`` adapted) on the imported run, into ``root/lora``."""
    from tests.training.fixtures import config, text_file
    from vaswani.config import dump_toml
    from vaswani.training.train import Launch, train

    cfg = config(root / "lora.toml", "decoder", text_file(root / "text.txt", n=400),
                 data={"block_size": 16, "batch_size": 4},
                 train={"max_steps": 2, "eval_every": 2, "lr": 1e-2, "warmup": 0,
                        "schedule": "constant", "metric_examples": 0,
                        "init_from": str(run_dir)})
    cfg.write_text(cfg.read_text() + "\n" + dump_toml({"finetune": {
        "method": "lora", "rank": 4, "alpha": 8.0,
        "targets": list(targets)}}))
    train(str(cfg), [], out=str(root / "lora"), launch=Launch(progress=False))


def lora_loads_in_peft(transformers, run_dir, root,
                       targets=("q", "k", "v", "o", "gate", "up", "down")):
    """Two LoRA steps on the imported run (``targets``: every projection adapted), exported:
    peft loads the adapters on the exported base with vaswani's logits (1e-4)."""
    peft = pytest.importorskip("peft")
    from vaswani.export import export

    lora_steps(run_dir, root, targets)
    out = export(root / "lora", "hf", root / "lora-hf")
    theirs = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(out), out / "adapter").eval()
    ours = vaswani.load(root / "lora").model
    ids = torch.randint(1, VOCAB, (2, 12))
    with torch.no_grad():
        with theirs.disable_adapter():  # the adapters changed the model
            assert (theirs(ids).logits - ours(ids)).abs().max() > 1e-3
        assert_close(theirs(ids).logits, ours(ids), rtol=1e-4, atol=1e-4)


class Checks:
    """The checks above as tests: an architecture's test file subclasses this with its
    ``architecture`` name and ``build(transformers)``, a random model of its class, and
    pytest runs each check on it (``no_gguf``, ``no_peft``: why a check does not apply)."""

    architecture: str
    no_gguf = ""  # why this model has no GGUF file as llama.cpp writes it
    no_peft = ""  # why its adapters do not load in peft
    lora_targets = ("q", "k", "v", "o", "gate", "up", "down")  # what peft's check adapts

    @staticmethod
    def build(transformers):
        raise NotImplementedError

    @pytest.fixture(scope="class")
    def transformers(self):
        return pytest.importorskip("transformers", reason="transformers is a test dependency")

    @pytest.fixture(scope="class")
    def imported(self, transformers, tmp_path_factory):
        model = self.build(transformers)
        return (model, *imported(model, tmp_path_factory.mktemp(self.architecture)))

    def test_logits_equal_transformers_in_float64(self, imported):
        model, _, run_dir = imported
        logits_equal(model, run_dir, self.architecture)

    def test_the_run_names_its_architecture_and_only_what_varies(self, imported):
        """The import's config.toml: the architecture's name first, none of the settings it
        fixes; read, the run has every one of them."""
        import tomllib

        from vaswani import rundir
        from vaswani.architectures import fixes

        model = tomllib.loads((imported[2] / "config.toml").read_text())["model"]
        assert list(model)[0] == "architecture" and model["architecture"] == self.architecture
        for option in fixes(self.architecture):
            section, _, key = option.rpartition(".")
            assert key not in (model.get(section, {}) if section else model), option
        config = rundir.read_config(imported[2]).model
        assert {o: config.setting(o) for o in fixes(self.architecture)} == fixes(
            self.architecture)

    def test_greedy_tokens_equal_transformers_and_the_engine(self, imported):
        model, _, run_dir = imported
        greedy_tokens_equal(model, run_dir)

    def test_export_writes_the_same_class_and_logits_back(self, transformers, imported,
                                                          tmp_path):
        model, _, run_dir = imported
        exports_back(transformers, model, run_dir, tmp_path / "back")

    def test_a_gguf_file_as_llama_cpp_writes_it(self, transformers, imported, tmp_path):
        if self.no_gguf:
            pytest.skip(self.no_gguf)
        gguf = pytest.importorskip("gguf")
        gguf_imports(transformers, gguf, imported[0], self.architecture, tmp_path)

    def test_int8_and_int4(self, imported):
        quantized_near(imported[2])

    def test_lora_adapters_load_in_peft(self, transformers, imported, tmp_path):
        if self.no_peft:
            pytest.skip(self.no_peft)
        lora_loads_in_peft(transformers, imported[2], tmp_path, self.lora_targets)
