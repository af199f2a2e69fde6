import pytest

from vaswani.data.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    load_tokenizers,
    save_tokenizers,
    train_tokenizer,
)

TEXTS = ["¡Hola, mundo! ¿Qué tal?", "The quick brown fox — naïve café", "tabs\tand  spaces"]


def test_special_ids_are_fixed_for_both_kinds():
    for tok in (CharTokenizer.train(TEXTS), BPETokenizer.train(TEXTS * 5, 300)):
        assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
        assert [tok.token(i) for i in range(4)] == ["<pad>", "<bos>", "<eos>", "<unk>"]


def test_char_round_trip_is_lossless_and_unknowns_map_to_unk():
    tok = CharTokenizer.train(TEXTS)
    for t in TEXTS:
        assert tok.decode(tok.encode(t)) == t
    assert tok.encode("Ω") == [tok.unk_id]
    assert tok.decode([tok.bos_id, *tok.encode("Hola"), tok.eos_id, tok.pad_id]) == "Hola"


def test_bpe_round_trips_any_text_including_unseen_characters():
    tok = BPETokenizer.train(TEXTS * 5, 300)
    for t in TEXTS + ["ünïcödé never seen 日本語 🙂", "  leading and trailing  "]:
        assert tok.decode(tok.encode(t)) == t
    assert tok.unk_id not in tok.encode("日本語")  # byte-level: no unknowns
    assert tok.vocab_size <= 300


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_save_and_load_shared_and_separate(tmp_path, kind):
    src = train_tokenizer(kind, TEXTS, 300)
    tgt = train_tokenizer(kind, [t.upper() for t in TEXTS], 300)
    save_tokenizers(tmp_path / "shared", src, src)
    a, b = load_tokenizers(tmp_path / "shared")
    assert a is b and a.encode(TEXTS[0]) == src.encode(TEXTS[0])
    save_tokenizers(tmp_path / "separate", src, tgt)
    a, b = load_tokenizers(tmp_path / "separate")
    assert a is not b and b.encode("HOLA") == tgt.encode("HOLA")
    save_tokenizers(tmp_path / "one", src)
    assert load_tokenizers(tmp_path / "one")[1] is None


def test_missing_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_tokenizers(tmp_path)
