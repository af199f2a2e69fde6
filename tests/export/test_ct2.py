"""CTranslate2 export: the copy-task translator, a BPE language model and a LLaMA-option
decoder (RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases) run in CTranslate2 give
vaswani's outputs; int8 still copies; every option without a counterpart is refused by name."""

from collections import defaultdict

import pytest
import torch

import vaswani
from vaswani.cli import main
from vaswani.export import ExportError, export

ctranslate2 = pytest.importorskip("ctranslate2", reason="vaswani[export] is not installed")
from vaswani.export.ct2 import check  # noqa: E402
from vaswani.inference.ct2 import load as Engine  # noqa: E402

STRINGS = ["abcdefghij", "jihgfedcba", "aabbcc", "j", "abcabcabcabcabc", "hgfedcbaabcdefgh"]


@pytest.fixture(scope="module")
def copy_export(copy_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("ct2") / "copy"
    export(copy_run[0], "ct2", out)
    return vaswani.load(copy_run[0]), Engine(out)


def test_greedy_translations_are_vaswanis(copy_export):
    run, engine = copy_export
    texts = STRINGS + ["", "bad"]
    assert engine.translate(texts, beam=1) == run.translate(texts, beam=1)


def test_beam_n_best_scores_match_to_1e_3(copy_export):
    """Length penalty 0: both score a hypothesis by its log-probability (<eos> included)."""
    run, engine = copy_export
    ours = run.translate(STRINGS, beam=4, n_best=4, length_penalty=0)
    theirs = engine.translate(STRINGS, beam=4, n_best=4, length_penalty=0)
    for a, b in zip(ours, theirs, strict=True):
        assert a[0][0] == b[0][0]
        assert abs(a[0][1] - b[0][1]) < 1e-3
        # two hypotheses may read the same (token sequences that differ only in a token that
        # prints as nothing): compare the scores of each text in order, not one per text
        ours_by_text, theirs_by_text = defaultdict(list), defaultdict(list)
        for text, s in a:
            ours_by_text[text].append(s)
        for text, s in b:
            theirs_by_text[text].append(s)
        shared = [(x, y) for text in ours_by_text.keys() & theirs_by_text.keys()
                  for x, y in zip(ours_by_text[text], theirs_by_text[text], strict=False)]
        assert len(shared) >= 2
        # vaswani's beam renormalises over all tokens but <pad> and <bos>, CTranslate2 over
        # all: the other hypotheses may differ by that leaked mass (measured up to 4e-3)
        assert all(abs(x - y) < 5e-3 for x, y in shared), (a, b)


def test_int8_export_still_copies(copy_run, tmp_path):
    out = tmp_path / "int8"
    assert main(["export", str(copy_run[0]), "--format", "ct2", "--out", str(out),
                 "--quantize", "int8"]) == 0
    engine = Engine(out)
    got = engine.translate(STRINGS, beam=4)
    # int8 costs this 64-wide model much of its accuracy (measured: 2 of 6 copied exactly),
    # yet it stays a copier: every output is close to its input
    assert got[0] == STRINGS[0]
    assert all(abs(len(g) - len(s)) <= 2 for g, s in zip(got, STRINGS, strict=True)), got
    assert (out / "model.bin").stat().st_size < 0.5 * (copy_run[0] / "model.safetensors"
                                                      ).stat().st_size


def test_cli_translate_with_the_ct2_engine(copy_export, tmp_path, capsys):
    _, engine = copy_export
    (tmp_path / "in.txt").write_text("abcdefg\n\njihg\n")
    folder = str(tmp_path / "exported")  # a fresh export through the CLI
    assert main(["export", str(copy_export[0].run_dir), "--format", "ct2", "--out",
                 folder]) == 0
    capsys.readouterr()
    assert main(["translate", folder, "--engine", "ct2", "--input",
                 str(tmp_path / "in.txt")]) == 0
    assert capsys.readouterr().out == "abcdefg\n\njihg\n"


def test_ctranslate2s_own_translate_batch_on_plain_tokens_is_vaswani(copy_export):
    """What a CTranslate2 user does: the source's tokens, no <eos> (the export's config adds
    it), the decoding length the export's README gives; 30 copy-task inputs."""
    import random

    run, engine = copy_export
    rng = random.Random(1)
    texts = ["".join(rng.choices("abcdefghij", k=rng.randint(1, 20))) for _ in range(30)]
    readme = (engine.folder / "README.md").read_text()
    cap = run.config.model.max_len - 1
    assert f"max_decoding_length={cap}" in readme and "add_source_eos: true" in readme
    assert "min_decoding_length=0" in readme  # CT2's default of 1 forbids empty translations
    assert "suppress_sequences=[['<pad>'], ['<bos>']]" in readme
    translator = ctranslate2.Translator(str(engine.folder))
    results = translator.translate_batch([list(t) for t in texts], beam_size=1,
                                         min_decoding_length=0, max_decoding_length=cap,
                                         suppress_sequences=[["<pad>"], ["<bos>"]])
    theirs = ["".join(r.hypotheses[0]) for r in results]
    assert theirs == run.translate(texts, beam=1)
    assert sum(a == b for a, b in zip(theirs, texts, strict=True)) >= 25  # and it copies


def test_ctranslate2s_own_generate_batch_on_plain_tokens_is_vaswani(small_runs, tmp_path):
    from vaswani.data.tokenizers import token_strings

    run_dir = small_runs["decoder"][0]
    export(run_dir, "ct2", tmp_path / "lm")
    run = vaswani.load(run_dir)
    names = token_strings(run.source_tokenizer)
    generator = ctranslate2.Generator(str(tmp_path / "lm"))
    for prompt in ["the", "to be or"]:
        tokens = [names[i] for i in run.source_tokenizer.encode(prompt)]
        result = generator.generate_batch([tokens], max_length=20, sampling_topk=1,
                                          include_prompt_in_result=False,
                                          suppress_sequences=[["<pad>"], ["<bos>"]])[0]
        ids = [names.index(t) for t in result.sequences[0]]
        assert run.source_tokenizer.decode(ids) == run.generate(prompt, max_new_tokens=20,
                                                                temperature=0)


def test_an_export_without_add_source_eos_still_translates(copy_export, tmp_path):
    """Exports written before add_source_eos: the wrapper appends <eos> itself."""
    import json
    import shutil

    run, engine = copy_export
    old = tmp_path / "old"
    shutil.copytree(engine.folder, old)
    settings = json.loads((old / "config.json").read_text())
    settings["add_source_eos"] = False
    (old / "config.json").write_text(json.dumps(settings))
    assert Engine(old).translate(STRINGS, beam=1) == run.translate(STRINGS, beam=1)


def test_a_prompt_past_max_len_is_refused_by_name_not_a_ct2_crash(small_runs, tmp_path):
    run_dir = small_runs["decoder"][0]
    export(run_dir, "ct2", tmp_path / "lm")
    engine = Engine(tmp_path / "lm")
    max_len = engine.config.model.max_len
    long = "the " * max_len
    with pytest.raises(ValueError, match="prompt 2 has .* tokens, the model's max_len is"):
        engine.generate_many(["a", long], max_new_tokens=5, temperature=0)
    # a prompt that nearly fills it gets the tokens that fit, not an error
    near = "ab" * 10
    assert isinstance(engine.generate(near, max_new_tokens=max_len, temperature=0), str)


def test_language_model_greedy_is_vaswanis(small_runs, tmp_path):
    run_dir = small_runs["decoder"][0]
    export(run_dir, "ct2", tmp_path / "lm")
    run, engine = vaswani.load(run_dir), Engine(tmp_path / "lm")
    for prompt in ["the", "to be or", "a"]:
        assert engine.generate(prompt, max_new_tokens=20, temperature=0) == \
            run.generate(prompt, max_new_tokens=20, temperature=0)


def test_llama_options_greedy_is_vaswanis(tmp_path):
    """RoPE (rotate-half), RMSNorm, SwiGLU, 2 key/value heads for 4 query heads, no biases."""
    from tests.reliability.checkpoints import llama_gguf
    from vaswani.pretrained.importer import import_gguf

    run_dir = import_gguf(str(llama_gguf(tmp_path / "m.gguf")), tmp_path / "llama",
                          tmp_path / "cache")
    run = vaswani.load(run_dir)
    c = run.config.model
    assert (c.positional, c.norm, c.activation, c.bias) == ("rope", "rmsnorm", "swiglu", False)
    export(run_dir, "ct2", tmp_path / "out")
    engine = Engine(tmp_path / "out")
    for prompt in ["abc", "hello"]:
        assert engine.generate(prompt, max_new_tokens=12, temperature=0) == \
            run.generate(prompt, max_new_tokens=12, temperature=0)


@pytest.mark.parametrize("change, message", [
    ({"arch": "encoder", "n_classes": 2, "tgt_vocab_size": None},
     "[model] arch = 'encoder' has no counterpart"),
    ({"positional": "none"}, "[model] positional = 'none' has no counterpart"),
    ({"positional": "rope"}, "a translator takes sinusoidal or learned positions"),
    ({"embed_norm": True}, "[model] embed_norm = True"),
    ({"type_vocab_size": 2}, "[model] type_vocab_size = 2"),
    ({"n_kv_heads": 2}, "[model] n_kv_heads = 2"),
    ({"qkv_bias": False}, "[model] qkv_bias = False"),
    ({"rope": {"scaling": "llama3"}}, "[model.rope] scaling = 'llama3'"),
])
def test_options_without_a_counterpart_are_refused(copy_export, change, message):
    run, _ = copy_export
    with pytest.raises(ExportError) as e:
        check(run.config.model.replace(**change))
    assert message in str(e.value)


def test_a_refused_export_leaves_out_as_it_was(small_runs, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert main(["export", str(small_runs["encoder"][0]), "--format", "ct2", "--out", str(out),
                 "--overwrite"]) == 2
    assert "arch = 'encoder'" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert main(["export", str(small_runs["decoder"][0]), "--format", "ct2", "--out",
                 str(out)]) == 2
    assert "not empty; pass --overwrite" in capsys.readouterr().err


def test_output_length_is_capped_at_max_len_like_vaswanis(copy_export):
    """A source near max_len: the length rule (max_len_a * source + max_len_b) would pass the
    position table; both engines stop at max_len instead of failing. Length penalty 0: the
    two engines normalise by length differently (GNMT's ((5 + |y|) / 6) ** alpha against
    CTranslate2's |y| ** alpha), so with the run's 0.6 their best hypotheses may differ where
    the model is unsure, whatever the cap."""
    run, engine = copy_export
    long = ["abcdefghij" * 3, "jihgfedcba" * 2]
    assert engine.translate(long, beam=4, length_penalty=0.0) == \
        run.translate(long, beam=4, length_penalty=0.0)


@pytest.mark.parametrize("first", ["<eos>", "<bos>"])
def test_ctranslate2_with_the_readmes_options_agrees_where_its_defaults_do_not(tmp_path,
                                                                               first):
    """A model whose likeliest token is always ``first``: vaswani then translates to "" (<eos>)
    or to the next likeliest token (it never outputs <bos>); CTranslate2's defaults
    (min_decoding_length 1, nothing suppressed) differ, the README's options agree."""
    from tests.training.fixtures import config, reverse_task
    from vaswani.checkpoint import read_weights, write_tensors
    from vaswani.training.train import Launch, train

    run_dir = tmp_path / "run"
    cfg = config(tmp_path / "c.toml", "encoder-decoder", reverse_task(tmp_path / "p.tsv"),
                 train={"max_steps": 2})
    train(str(cfg), [], out=str(run_dir), launch=Launch(progress=False))
    weights = read_weights(run_dir / "model.safetensors")
    token = {"<eos>": 2, "<bos>": 1}[first]  # the ids of tokenizers.SPECIALS
    u = torch.nn.functional.normalize(torch.randn(weights["tgt_embed.token.weight"].shape[1],
                                                  generator=torch.Generator().manual_seed(0)),
                                      dim=0)
    weights["tgt_embed.token.weight"][token] = 5 * u  # the output projection is tied to it
    weights["decoder.layers.0.ff_block.norm.weight"].zero_()  # the last norm: every state u
    weights["decoder.layers.0.ff_block.norm.bias"].copy_(10 * u)
    write_tensors(run_dir / "model.safetensors", weights)
    export(run_dir, "ct2", tmp_path / "t", overwrite=True)
    run = vaswani.load(run_dir)
    texts = ["abc", "fedcba", "b"]
    ours = run.translate(texts, beam=1)
    assert ours == [""] * 3 if first == "<eos>" else all(ours)

    translator = ctranslate2.Translator(str(tmp_path / "t"))
    d, cap = run.config.decode, run.config.model.max_len - 1

    def theirs(**options):
        out = []
        for text in texts:
            limit = min(int(d.max_len_a * (len(text) + 1) + d.max_len_b), cap)
            result = translator.translate_batch([list(text)], beam_size=1,
                                                max_decoding_length=limit, **options)[0]
            out.append("".join(result.hypotheses[0]))
        return out

    assert theirs() != ours  # CTranslate2's defaults
    readme = (tmp_path / "t" / "README.md").read_text()
    assert "min_decoding_length=0" in readme
    assert "suppress_sequences=[['<pad>'], ['<bos>']]" in readme
    assert theirs(min_decoding_length=0, suppress_sequences=[["<pad>"], ["<bos>"]]) == ours
    assert Engine(tmp_path / "t").translate(texts, beam=1) == ours  # vaswani's ct2 wrapper


def test_a_translator_with_a_vocabulary_for_each_language_runs_in_ctranslate2(tmp_path, capsys):
    """`make demo`'s layout (``data.shared_vocab = false``, ``model.share_embeddings =
    false``) on a task whose languages share no character: the training log names both
    vocabularies, the model has an embedding for each, and CTranslate2 given the two
    vocabularies translates as vaswani does."""
    import random

    from tests.training.fixtures import config

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdef") for _ in range(rng.randint(3, 12))) for _ in range(300)]
    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"{w}\t{w[::-1].upper()}\n" for w in words))
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data,
                 data={"tokenizer": "bpe", "vocab_size": 300, "shared_vocab": False},
                 model={"share_embeddings": False}, train={"max_steps": 12})
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run), "--no-progress"]) == 0
    translator = vaswani.load(run)
    source, target = translator.source_tokenizer, translator.target_tokenizer
    assert source.encode("ABC") != target.encode("ABC")  # two tokenizers, two alphabets
    assert (f"vocabularies {source.vocab_size:,} source / {target.vocab_size:,} target"
            in capsys.readouterr().err)
    model = translator.model
    assert model.src_embed.token.weight.data_ptr() != model.tgt_embed.token.weight.data_ptr()
    export(run, "ct2", tmp_path / "ct2")
    texts = ["abcdef", "fedcba", "aabbcc", "cab"]
    assert Engine(tmp_path / "ct2").translate(texts, beam=1) == translator.translate(texts, beam=1)
