"""The text of a language model's output as it streams (inference/language_model.py
``TextStream``): against showing text by decoding the whole output at every token, with the
tokenizers vaswani trains and the kinds a pretrained checkpoint brings."""

import random
import re

import pytest

from vaswani.data.tokenizers import BPETokenizer, CharTokenizer, PretrainedTokenizer
from vaswani.inference.language_model import TextStream

TEXT = ("El niño comió piñas y café. Ça coûte 5 € — très cher! 日本語 la mañana, "
        "the cat sat on the mat 🙂 and the dog ate it. ") * 3
STOPS = [[], ["mat"], ["\n\n", "ñas y"], ["€ —", "t 🙂"]]


def whole_decoding(tok, ids: list[int], stop: list[str]) -> tuple[list[str], str, bool]:
    """The reference: the pieces shown by decoding the whole output at every token (the
    text cut before the first stop string, incomplete characters waited for, and the start
    of a stop string held back), the whole text, and whether a stop string was met."""
    pieces, shown = [], ""
    for n in range(1, len(ids) + 1):
        text = tok.decode(ids[:n])
        cuts = [text.find(s) for s in stop if s in text]
        if cuts:
            text = text[: min(cuts)]
            pieces.append(text[len(shown):] if text.startswith(shown) else "")
            return pieces, text, True
        if text.endswith("\ufffd"):
            pieces.append("")
            continue
        hold = max((k for s in stop for k in range(1, len(s)) if text.endswith(s[:k])),
                   default=0)
        visible = text[: len(text) - hold]
        pieces.append(visible[len(shown):] if visible.startswith(shown) else "")
        shown = visible if visible.startswith(shown) else shown
    return pieces, tok.decode(ids), False


def char():
    return CharTokenizer(sorted(set(TEXT)))


def bpe():  # byte-level: a character of several bytes may span tokens
    return BPETokenizer.train([TEXT], vocab_size=300)


def word_level(decoder: str):
    """A SentencePiece-like (Metaspace: a word's leading space is its first token's) or a
    WordPiece tokenizer (BERT: "##" joins, spaces go between words and before no
    punctuation), whose text of a token depends on the token before it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = sorted({w for w in TEXT.replace(".", " .").replace(",", " ,").split()})
    if decoder == "metaspace":
        vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", *(f"▁{w}" for w in words),
                                             *words])}
        hf = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
        hf.pre_tokenizer = pre_tokenizers.Metaspace()
        hf.decoder = decoders.Metaspace()
    else:
        vocab = {w: i for i, w in enumerate(["[PAD]", "[CLS]", "[SEP]", *words,
                                             *(f"##{w}" for w in words)])}
        hf = Tokenizer(models.WordPiece(vocab, unk_token="[PAD]"))
        hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        hf.decoder = decoders.WordPiece()
    return PretrainedTokenizer(hf, {"pad": 0, "bos": 1, "eos": 2})


TOKENIZERS = {"char": char, "bpe": bpe, "metaspace": lambda: word_level("metaspace"),
              "wordpiece": lambda: word_level("wordpiece")}


@pytest.mark.parametrize("kind", TOKENIZERS)
@pytest.mark.parametrize("stop", STOPS, ids=lambda s: "|".join(s) or "none")
def test_text_stream_shows_what_decoding_the_whole_output_shows(kind, stop):
    tok = TOKENIZERS[kind]()
    rng = random.Random(0)
    outputs = [tok.encode(TEXT)]  # real text, and token soup (bytes of a character apart)
    outputs += [[rng.randrange(3, tok.vocab_size) for _ in range(120)] for _ in range(3)]
    for ids in outputs:
        pieces, text, stopped = whole_decoding(tok, ids, stop)
        stream = TextStream(tok, stop)
        got = [stream.push(i) for i in ids]
        assert got[: len(pieces)] == pieces
        assert not any(got[len(pieces):])  # nothing after a stop string
        assert stream.stopped == stopped
        rest = stream.finish()
        assert stream.text == text
        assert "".join(got) + rest == text


class Counting(CharTokenizer):
    """A tokenizer that counts the ids it is asked to decode."""

    decoded = 0

    def decode(self, ids):
        ids = list(ids)
        self.decoded += len(ids)
        return super().decode(ids)


def test_text_stream_decodes_a_few_tokens_per_token_not_the_whole_output():
    """Decoding the whole output at every token would cost n * (n + 1) / 2 ids for n tokens
    (125,250 for 500): each token's text comes from the tokens since the text was last whole."""
    tok = Counting(sorted(set(TEXT)))
    stream = TextStream(tok, ["never there"])
    ids = tok.encode(TEXT * 2)[:500]
    for i in ids:
        stream.push(i)
    assert tok.decoded <= 4 * 500
    before = tok.decoded
    stream.finish()  # the whole output, once
    assert tok.decoded - before == 500
    assert stream.text == tok.decode(ids)


def test_text_stream_stops_at_a_stop_string_and_holds_back_its_start():
    tok = CharTokenizer("abc\n")
    stream = TextStream(tok, ["\n\n", "cab"])
    shown = [stream.push(i) for i in tok.encode("ab\nab\nca")]
    assert "".join(shown) == "ab\nab\n"  # "\n" and "ca" may start a stop string: held
    assert not stream.stopped and stream.finish() == "ca"
    stream = TextStream(tok, ["\n\n"])
    out = "".join(stream.push(i) for i in tok.encode("ab\n\nc"))
    assert stream.stopped and out == stream.text == "ab"


def test_generate_many_hands_in_the_longest_prompt_first_and_gives_each_its_own_text(
        small_runs):
    """generate_many submits its prompts longest first (their rows' contexts then stay in
    slot order, engine/cache.py ``parts``), returns the texts in the prompts' order, and a
    text is what generating it alone gives (decoded once at the end, with no stop string
    and nobody streaming)."""
    import vaswani

    run = vaswani.load(small_runs["decoder"][0])
    submitted = []
    submit = run.engine.submit
    run.engine.submit = lambda request: submitted.append(len(request.prompt)) or submit(request)
    prompts = ["to", "the king and the queen of the land", "a", "to be or not to be"]
    many = run.generate_many(prompts, max_new_tokens=6, temperature=0)
    assert submitted == sorted(submitted, reverse=True) and len(set(submitted)) == 4
    assert many == [run.generate(p, max_new_tokens=6, temperature=0) for p in prompts]
    # sampled, the i-th with seed + i: texts that differ (a tiny model's greedy texts may all
    # be one word repeated, as on CUDA), each in its prompt's place
    drawn = run.generate_many(prompts, max_new_tokens=6, temperature=1.0, seed=7)
    assert drawn == [run.generate(p, max_new_tokens=6, temperature=1.0, seed=7 + i)
                     for i, p in enumerate(prompts)]
    assert len(set(drawn)) == 4
    pushed = run.generate_many(prompts, max_new_tokens=6, temperature=0,
                               stop=["never in it"])  # a stop string: text token by token
    assert pushed == many


def test_generating_one_text_makes_an_engine_of_one_row(small_runs):
    """(inference/base.py ``engine_for``): the cache made for one prompt holds one row;
    generate_many's prompts get a row each."""
    import vaswani

    run = vaswani.load(small_runs["decoder"][0])
    alone = run.generate("to be", max_new_tokens=4, temperature=0)
    assert run.engine_for(1).config.max_rows == 1
    assert run.generate_many(["to be", "a", "the king"], max_new_tokens=4,
                             temperature=0)[0] == alone
    assert run.engine_for(1).config.max_rows == 4


def test_generate_speculate_gives_the_same_text_and_says_how_many_guesses_held(small_runs,
                                                                               capsys):
    from vaswani.cli import main

    run = str(small_runs["decoder"][0])
    prompt = ["--prompt", "to be or not to be, to be or not to be, to be or", "--temperature",
              "0", "--max-new-tokens", "24"]
    assert main(["generate", run, *prompt]) == 0
    plain = capsys.readouterr()
    assert main(["generate", run, *prompt, "--speculate", "4"]) == 0
    fast = capsys.readouterr()
    assert fast.out == plain.out and "speculation" not in plain.err
    assert re.search(r"speculation: \d+ of \d+ guessed tokens held \(\d+%\), in [1-9]\d* "
                     r"passes", fast.err)


def test_generate_draft_guesses_with_another_run_and_refuses_one_of_another_kind(small_runs,
                                                                                capsys):
    """`--draft RUN_DIR` (engine/draft.py): the run as its own draft gives the plain text in
    fewer passes; a classifier, or a language model of another vocabulary, is refused."""
    from vaswani import load
    from vaswani.cli import main

    run, classifier = str(small_runs["decoder"][0]), str(small_runs["encoder"][0])
    prompt = ["--prompt", "to be or not to be", "--temperature", "0", "--max-new-tokens", "24"]
    assert main(["generate", run, *prompt]) == 0
    plain = capsys.readouterr()
    assert main(["generate", run, *prompt, "--draft", run]) == 0  # 4 tokens a guess
    drafted = capsys.readouterr()
    assert drafted.out == plain.out
    held = re.search(r"speculation: (\d+) of (\d+) guessed tokens held", drafted.err)
    assert held and int(held[2]) > 0 and int(held[1]) > int(held[2]) // 2  # its own guesses
    assert main(["generate", run, *prompt, "--draft", classifier]) == 2
    assert "a draft is a language model" in capsys.readouterr().err
    lm, other = load(run), load(run)
    other.source_tokenizer = load(classifier).source_tokenizer  # another BPE of 300 tokens
    with pytest.raises(ValueError, match="vocabulary is not"):
        lm.set_draft(other)
    lm.set_draft(load(run))
    assert lm.generate("to be or not to be", max_new_tokens=24, temperature=0,
                       speculate=3) + "\n" == plain.out.removeprefix("to be or not to be")
    assert lm.engine_for(1).speculation.passes > 0


def test_generate_json_schema_writes_json_the_schema_accepts(small_runs, capsys, tmp_path):
    """`--json-schema FILE` and `--json` (generation/grammar.py); a file that is not a JSON
    schema is named with the line of the fault."""
    import json

    import jsonschema_rs

    from vaswani.cli import main

    run = str(small_runs["decoder"][0])
    schema = {"type": "object", "properties": {"to": {"enum": ["be", "not"]},
                                               "n": {"type": "integer", "maximum": 9}},
              "required": ["to", "n"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    prompt = ["--prompt", "to be", "--max-new-tokens", "80"]
    assert main(["generate", run, *prompt, "--json-schema", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("to be")
    jsonschema_rs.validate(schema, json.loads(out[len("to be"):]))
    assert main(["generate", run, *prompt, "--json"]) == 0  # any object (it may not end)
    assert capsys.readouterr().out.startswith("to be{")
    assert main(["generate", run, *prompt, "--json", "--json-schema", str(path)]) == 2
    assert "give one" in capsys.readouterr().err
    path.write_text('{"type": "object",\n "properties": {')
    assert main(["generate", run, *prompt, "--json-schema", str(path)]) == 2
    assert f"{path}, line 2, column" in capsys.readouterr().err
    path.write_text('["not", "a schema"]')
    assert main(["generate", run, *prompt, "--json-schema", str(path)]) == 2
    assert "a JSON schema is an object" in capsys.readouterr().err
