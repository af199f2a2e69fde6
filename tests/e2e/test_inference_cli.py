"""The inference commands and vaswani.load on trained runs."""

import hashlib
import io
import json
import shutil
import subprocess
import sys
import warnings

import pytest
import sacrebleu

import vaswani
from tests.conftest import read_json_line
from vaswani.cli import main

COPY_INPUTS = ["abcdefgh", "", "jjjaaabbbcc", "hello", "  "]


def test_translate_keeps_one_line_per_input_line_including_blanks(copy_run, tmp_path, capsys):
    run, _, _ = copy_run
    inputs = tmp_path / "in.txt"
    inputs.write_text("\n".join(COPY_INPUTS) + "\n")
    for extra in ([], ["--beam", "1"], ["--beam", "3", "--n-best", "2"]):
        assert main(["translate", str(run), "--input", str(inputs), *extra]) == 0
        out = capsys.readouterr().out.split("\n")[:-1]
        assert len(out) == len(COPY_INPUTS)
        assert out[1] == "" and out[4] == ""
        assert out[0].split("\t")[0] == "abcdefgh"
        if "--n-best" in extra:
            assert len(out[0].split("\t")) == 4  # two (translation, score) pairs




def test_translate_from_stdin_subprocess(copy_run):
    run, _, _ = copy_run
    result = subprocess.run([sys.executable, "-m", "vaswani", "translate", str(run)],
                            input="abcabc\n\nhgfedc\n", capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "abcabc\n\nhgfedc\n"  # strings of the task's lengths (5-20)


def test_python_api_load_translate(copy_run):
    run = vaswani.load(copy_run[0])
    assert isinstance(run, vaswani.Translator) and run.task.name == "translation"
    assert run.translate(["abcdef", ""]) == ["abcdef", ""]
    assert run.translate(["abcdef"], beam=1) == ["abcdef"]
    nbest = run.translate(["abcdef"], beam=3, n_best=3)[0]
    assert nbest[0][0] == "abcdef" and nbest[0][1] >= nbest[1][1] >= nbest[2][1]
    with pytest.raises(ValueError, match="generate needs a language model"):
        run.generate("abc")


def test_over_long_input_is_truncated_with_a_warning(copy_run):
    run = vaswani.load(copy_run[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.translate(["a" * 100, "abc", "b" * 40])
    messages = [str(w.message) for w in caught]
    assert messages == ["2 of 3 input(s) were longer than the model's max_len (32 tokens) and "
                        "were truncated (the longest, input 1, had 100)"]


def test_evaluate_translation_matches_sacrebleu_called_directly(copy_run, tmp_path, capsys):
    run_dir = copy_run[0]
    pairs = [("abc def", "abc def"), ("ghij abc", "ghij abd"), ("aaa bbb ccc", "aaa bbb ccc"),
             ("jihg fed", "jihg fed cba")]
    data = tmp_path / "eval.tsv"
    data.write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    assert main(["evaluate", str(run_dir), "--data", str(data)]) == 0
    result = read_json_line(capsys.readouterr().out)
    hyps = vaswani.load(run_dir).translate([s for s, _ in pairs])
    refs = [t for _, t in pairs]
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert result["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert result["sentences"] == 4
    saved = tmp_path / "hyps.txt"
    assert main(["evaluate", str(run_dir), "--data", str(data), "--save-outputs",
                 str(saved)]) == 0
    assert read_json_line(capsys.readouterr().out)["outputs"] == str(saved)
    assert saved.read_text().splitlines() == hyps


def test_attention_draws_a_png(copy_run, tmp_path, capsys):
    out = tmp_path / "att.png"
    assert main(["attention", str(copy_run[0]), "--text", "abcdef", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "cross-attention" in capsys.readouterr().out
    grid = tmp_path / "grid.png"
    assert main(["attention", str(copy_run[0]), "--text", "abc", "--target", "abc",
                 "--all-heads", "--layer", "0", "--out", str(grid)]) == 0
    assert grid.exists()
    assert main(["attention", str(copy_run[0]), "--text", "abc", "--head", "9",
                 "--out", str(grid)]) == 2
    assert "head (9) must be in [0, 4)" in capsys.readouterr().err


def test_generate_streams_and_is_seedable(small_runs, capsys):
    run_dir, _ = small_runs["decoder"]
    args = ["generate", str(run_dir), "--prompt", "to be", "--max-new-tokens", "12",
            "--seed", "3", "--top-k", "5"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert first.startswith("to be") and len(first) > len("to be\n")
    assert main(args) == 0
    assert capsys.readouterr().out == first
    run = vaswani.load(run_dir)
    chunks = []
    text = run.generate("to be", max_new_tokens=8, temperature=0, stream=chunks.append)
    assert "".join(chunks) == text
    assert run.generate("to be", max_new_tokens=8, top_k=1) == text


def test_evaluate_language_model(small_runs, capsys):
    run_dir, data = small_runs["decoder"]
    assert main(["evaluate", str(run_dir), "--split", "test"]) == 0
    r = read_json_line(capsys.readouterr().out)
    assert r["task"] == "lm" and r["perplexity"] == pytest.approx(2.718281828 ** r["loss"])
    assert r["bits_per_token"] == pytest.approx(r["loss"] / 0.6931471805599453)
    assert 0 < r["bits_per_char"] < r["bits_per_token"]
    max_len = vaswani.load(run_dir).config.model.max_len
    n_tokens = len(vaswani.load(run_dir).source_tokenizer.encode(data.read_text()))
    assert r["windows"]["length"] == max_len
    assert r["windows"]["count"] == -(-r["tokens"] // max_len)  # every token scored once
    assert n_tokens - 2 <= r["tokens"] <= n_tokens - 1  # (the file's last newline is read off)
    assert main(["evaluate", str(run_dir), "--split", "test", "--save-outputs", "x"]) == 2
    assert "produces no outputs" in capsys.readouterr().err


def test_classify_and_evaluate_classifier(small_runs, tmp_path, capsys):
    run_dir, data = small_runs["encoder"]
    inputs = tmp_path / "in.txt"
    inputs.write_text("a good b c\nbad a a b\n")
    assert main(["classify", str(run_dir), "--input", str(inputs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line in lines:
        label, p = line.split("\t")
        assert label in ("pos", "neg") and 0.5 <= float(p) <= 1.0
    assert main(["evaluate", str(run_dir), "--data", str(data)]) == 0
    r = read_json_line(capsys.readouterr().out)
    assert r["labels"] == ["neg", "pos"]
    assert sum(map(sum, r["confusion"])) == r["examples"] == 200
    correct = r["confusion"][0][0] + r["confusion"][1][1]
    assert r["accuracy"] == pytest.approx(correct / 200)
    assert 0 <= r["macro_f1"] <= 1


def test_clear_errors_for_bad_run_directories(copy_run, tmp_path, capsys, monkeypatch):
    assert main(["translate", str(tmp_path / "missing")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    broken = tmp_path / "broken"
    shutil.copytree(copy_run[0], broken)
    meta = json.loads((broken / "tokenizer/meta.json").read_text())
    source = broken / "tokenizer" / meta["source"]["file"]
    source.write_text(json.dumps(
        {"kind": "char", "specials": ["<pad>", "<bos>", "<eos>", "<unk>"], "chars": ["x"]}))
    # a tokenizer swapped in on purpose (its checksum updated too), not a damaged one
    meta["sha256"][source.name] = hashlib.sha256(source.read_bytes()).hexdigest()
    (broken / "tokenizer/meta.json").write_text(json.dumps(meta))
    monkeypatch.setattr("sys.stdin", io.StringIO("abc\n"))
    assert main(["translate", str(broken)]) == 2
    assert "does not belong to this model" in capsys.readouterr().err
    incomplete = tmp_path / "incomplete"
    shutil.copytree(copy_run[0], incomplete)
    (incomplete / "model.safetensors").unlink()
    shutil.rmtree(incomplete / "last")
    assert main(["translate", str(incomplete)]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err
    assert main(["evaluate", str(copy_run[0])]) == 2
    assert "names no [data] test files" in capsys.readouterr().err


def test_average_command_and_averaged_weights(copy_run, tmp_path, capsys, monkeypatch):
    from vaswani import checkpoint

    run = tmp_path / "run"
    shutil.copytree(copy_run[0], run)
    monkeypatch.setattr("sys.stdin", io.StringIO("abc\n"))
    assert main(["translate", str(run), "--weights", "averaged"]) == 2
    assert "has no averaged.safetensors" in capsys.readouterr().err
    assert main(["average", str(run)]) == 2
    assert "keep_checkpoints" in capsys.readouterr().err
    # two copies of the best weights: their average is the best weights, so translations agree
    for step in (100, 200):
        checkpoint.save_checkpoint(run, vaswani.load(run).model, step, keep=5)
    assert main(["average", str(run), "--last", "2"]) == 0
    assert "2 checkpoints (step-000100 .. step-000200)" in capsys.readouterr().err
    outputs = {}
    for weights in ("best", "averaged"):
        monkeypatch.setattr("sys.stdin", io.StringIO("abcdefg\nhijabc\n"))
        assert main(["translate", str(run), "--weights", weights]) == 0
        outputs[weights] = capsys.readouterr().out
    assert outputs["averaged"] == outputs["best"] == "abcdefg\nhijabc\n"


def test_quantize_int8_translates_from_python_and_the_cli(copy_run, tmp_path, capsys):
    """--quantize int8 (vaswani.load(..., quantize="int8")): every linear layer int8, the
    copy task still copied; a bad choice, CTranslate2 and a GPU are refused by name."""
    from vaswani.cpu.dynamic import Int8Linear

    run = vaswani.load(copy_run[0], quantize="int8")
    assert any(isinstance(m, Int8Linear) for m in run.model.modules())
    words = ["abcdefgh", "jjjaaabbbcc", "hello", "abcabc"]
    fp32 = vaswani.load(copy_run[0]).translate(words, beam=2)
    int8 = run.translate(words, beam=2)
    assert sum(a == b for a, b in zip(int8, fp32, strict=True)) >= 3  # rounding may move one
    inputs = tmp_path / "in.txt"
    inputs.write_text("abcdefgh\n")
    assert main(["translate", str(copy_run[0]), "--input", str(inputs), "--quantize",
                 "int8"]) == 0
    assert capsys.readouterr().out == "abcdefgh\n"
    with pytest.raises(ValueError, match=r"quantize \('int2'\) must be one of int8, int4"):
        vaswani.load(copy_run[0], quantize="int2")
    for kind in ("int4", "int4-g64"):
        with pytest.raises(ValueError, match=f"--quantize {kind} is for language models"):
            vaswani.load(copy_run[0], quantize=kind)
    with pytest.raises(ValueError, match="a CTranslate2 export is quantized when it is made"):
        vaswani.load(copy_run[0], engine="ct2", quantize="int8")


def test_a_translation_holding_line_breaks_stays_on_its_line(copy_run, tmp_path, capsys,
                                                            monkeypatch):
    """A byte-level BPE model can output the newline byte (a half-trained demo translator
    wrote 18 lines for 5 verses): translate and evaluate --save-outputs still write one line
    per input, n-best keeps its columns."""
    from vaswani.inference.translator import Translator

    made = ["one\ntwo", "tab\there\r\nand\u2028more", ""]
    monkeypatch.setattr(Translator, "translate",
                        lambda self, texts, n_best=1, **kw: made[:len(texts)] if n_best == 1
                        else [[(m, -1.0), (m + "\n!", -2.0)] for m in made[:len(texts)]])
    source = tmp_path / "in.txt"
    source.write_text("abc\nabcd\nabcde\n")
    assert main(["translate", str(copy_run[0]), "--input", str(source)]) == 0
    assert capsys.readouterr().out.split("\n") == ["one two", "tab\there  and more", "", ""]
    assert main(["translate", str(copy_run[0]), "--input", str(source), "--beam", "2",
                 "--n-best", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(len(line.split("\t")) == 4 for line in lines), lines
    monkeypatch.setattr(Translator, "evaluate",
                        lambda self, data, beam=None, outputs=None:
                        (outputs.extend(made), {"bleu": 0.0})[1])
    saved = tmp_path / "outputs.txt"
    assert main(["evaluate", str(copy_run[0]), "--data", str(source), "--save-outputs",
                 str(saved)]) == 0
    assert saved.read_text().split("\n") == ["one two", "tab\there  and more", "", ""]
