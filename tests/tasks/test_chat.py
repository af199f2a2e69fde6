"""[data] task = "chat": conversations read from JSONL, rendered with the chat template of the
run fine-tuned, with the loss on the assistant's tokens only."""

import json
import re

import pytest

from tests.training.fixtures import text_file
from tests.training.test_lora import LORA, _config
from vaswani import rundir
from vaswani.data.chat import iter_conversations, segments
from vaswani.data.files import DataError, ReadReport
from vaswani.training.train import Launch, train

# SmolLM2-Instruct's layout (ChatML), shortened: a header per turn, <|im_end|> after each
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}
TALK = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of Peru?"},
        {"role": "assistant", "content": "Lima."},
        {"role": "user", "content": "And Spain?"},
        {"role": "assistant", "content": "Madrid."}]


def test_the_assistants_turns_are_found_in_the_rendered_conversation():
    pieces = segments(CHATML, TALK, **SPECIALS)
    assert "".join(text for text, _ in pieces) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCapital of Peru?<|im_end|>"
        "\n<|im_start|>assistant\nLima.<|im_end|>\n<|im_start|>user\nAnd Spain?<|im_end|>\n"
        "<|im_start|>assistant\nMadrid.<|im_end|>\n")
    assert [text for text, answer in pieces if answer] == ["Lima.<|im_end|>\n",
                                                           "Madrid.<|im_end|>\n"]


def test_bad_lines_are_named_by_file_and_line(tmp_path):
    path = tmp_path / "chat.jsonl"
    good = json.dumps({"prompt": "Hi?", "response": "Hello."})
    for bad, says in [("{not json", "invalid JSON"),
                      (json.dumps({"messages": [{"role": "robot", "content": "x"}]}),
                       "message 0: role 'robot' must be one of"),
                      (json.dumps({"messages": [{"role": "user", "content": "x"}]}),
                       "no assistant message"),
                      (json.dumps({"messages": [{"role": "user", "content": ""},
                                                {"role": "assistant", "content": "y"}]}),
                       "message 0 \\(user\\): content must be a non-empty string"),
                      (json.dumps({"text": "x"}), "expected {\"messages\"")]:
        path.write_text(good + "\n\n" + bad + "\n")
        with pytest.raises(DataError, match=f"{path}:3: {says}"):
            list(iter_conversations([str(path)], ReadReport()))
    path.write_text(good + "\n")
    assert list(iter_conversations([str(path)], ReadReport())) == [
        [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]]


@pytest.fixture(scope="module")
def chat_base(tmp_path_factory):
    """A small LLaMA-shaped language model with a chat template, as an imported one has."""
    folder = tmp_path_factory.mktemp("chat")
    lines = [json.dumps({"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                                      {"role": "assistant", "content": f"{a + b}, of course."}]})
             for a in range(9) for b in range(9)]
    data = folder / "chat.jsonl"
    data.write_text("\n".join(lines) + "\n")
    text = text_file(folder / "text.txt")
    text.write_text(text.read_text() + data.read_text())  # the tokenizer sees these words too
    train(str(_config(folder / "base.toml", text, max_steps=2, model={"max_len": 256})), [],
          out=str(folder / "base"), launch=Launch(progress=False))
    (folder / "base" / rundir.CHAT_TEMPLATE).write_text(CHATML)
    return folder / "base", data


def test_only_the_assistants_tokens_carry_loss(chat_base, tmp_path):
    base, data = chat_base
    cfg = _config(tmp_path / "chat.toml", data, base, finetune=LORA, max_steps=4)
    cfg.write_text(cfg.read_text().replace("[data]\n", '[data]\ntask = "chat"\n'))
    train(str(cfg), [], out=str(tmp_path / "run"), launch=Launch(progress=False))
    assert (tmp_path / "run" / rundir.CHAT_TEMPLATE).read_text() == CHATML  # served as chat
    from vaswani.tasks import task_for

    config = rundir.read_config(tmp_path / "run")
    task = task_for(config)
    assert task.name == "chat"
    source, _, _ = rundir.read_tokenizers(tmp_path / "run")
    data_ = task.load(tmp_path / "cache", (source, None), progress=False)
    batch = task.collate([data_.train[i] for i in range(3)])
    for row in range(3):
        kept = batch["target"][row][batch["target"][row] != task.pad_id]
        said = source.decode(kept.tolist())  # the answer and its end of turn, nothing else
        assert re.fullmatch(r"\d+, of course\.<\|im_end\|>\n", said), said
        inputs = source.decode(batch["input"][row].tolist())
        assert "What is" in inputs  # but the model reads it
    assert batch.targets == int((batch["target"] != task.pad_id).sum()) > 0


def test_a_chat_run_needs_a_template_and_a_run_to_start_from(small_runs, tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"prompt": "a?", "response": "b."}) + "\n")
    cfg = _config(tmp_path / "a.toml", data)
    cfg.write_text(cfg.read_text().replace("[data]\n", '[data]\ntask = "chat"\n'))
    with pytest.raises(ValueError, match="set \\[train\\] init_from"):
        train(str(cfg), [], out=str(tmp_path / "a"), launch=Launch(progress=False))
    plain = small_runs["decoder"][0]  # trained by vaswani: no chat template
    cfg = _config(tmp_path / "b.toml", data, plain)
    cfg.write_text(cfg.read_text().replace("[data]\n", '[data]\ntask = "chat"\n'))
    with pytest.raises(ValueError, match="has none"):
        train(str(cfg), [], out=str(tmp_path / "b"), launch=Launch(progress=False))


def test_evaluate_scores_the_conversations_as_the_template_writes_them(chat_base, tmp_path):
    import vaswani

    base, data = chat_base
    cfg = _config(tmp_path / "chat.toml", data, base, finetune=LORA, max_steps=2)
    cfg.write_text(cfg.read_text().replace("[data]\n", '[data]\ntask = "chat"\n'))
    train(str(cfg), [], out=str(tmp_path / "run"), launch=Launch(progress=False))
    result = vaswani.load(tmp_path / "run").evaluate([str(data)])
    assert result["task"] == "chat" and result["perplexity"] > 1
