"""[train] init_from: start a classifier from another run's encoder (see also
tests/pretrained/test_real_checkpoints.py for MiniLM)."""

import pytest
import torch
from safetensors.torch import load_file

from tests.training.fixtures import classification_file, config
from vaswani.training.train import Launch, train


def one_step_from(base_dir, arch: str, data, out) -> tuple[dict, dict]:
    """Train one step at lr 1e-9 from ``base_dir``'s weights (so the trained weights are the
    loaded ones); returns (the base's weights, the run's weights after the step)."""
    cfg = config(out.with_suffix(".toml"), arch, data,
                 train={"init_from": str(base_dir), "max_steps": 1, "lr": 1e-9,
                        "schedule": "constant", "warmup": 0, "eval_every": 1})
    train(str(cfg), [], out=str(out), launch=Launch(progress=False))
    return (load_file(str(base_dir / "model.safetensors")),
            load_file(str(out / "last" / "model.safetensors")))


def test_init_from_loads_the_body_and_trains_a_new_head(small_runs, tmp_path):
    base_dir, _ = small_runs["encoder"]
    data = classification_file(tmp_path / "three.tsv", n=60)
    data.write_text(data.read_text().replace("pos\t", "mid\t", 10))  # 3 classes now
    before, after = one_step_from(base_dir, "encoder", data, tmp_path / "ft")
    torch.testing.assert_close(after["embed.token.weight"], before["embed.token.weight"],
                               rtol=0, atol=1e-6)  # lr 1e-9: the body is the base's
    assert after["head.weight"].shape[0] == 3 != before["head.weight"].shape[0]


def test_init_from_errors_name_the_problem(small_runs, tmp_path):
    data = classification_file(tmp_path / "d.tsv", n=20)
    cfg = config(tmp_path / "a.toml", "encoder", data, train={"init_from": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        train(str(cfg), [], out=str(tmp_path / "a"), launch=Launch(progress=False))
    decoder_dir, _ = small_runs["decoder"]
    cfg = config(tmp_path / "b.toml", "encoder", data, train={"init_from": str(decoder_dir)})
    with pytest.raises(ValueError, match="holds a 'decoder' model"):
        train(str(cfg), [], out=str(tmp_path / "b"), launch=Launch(progress=False))


def test_init_from_a_language_model_loads_every_weight(small_runs, tmp_path):
    base_dir, text = small_runs["decoder"]
    before, after = one_step_from(base_dir, "decoder", text, tmp_path / "lm")
    assert before.keys() == after.keys()
    for name in before:  # lr 1e-9: every weight, the output head too, is the base's
        torch.testing.assert_close(after[name], before[name], rtol=0, atol=1e-6, msg=name)


def test_weights_that_are_loaded_are_not_drawn_first(small_runs, tmp_path, monkeypatch):
    """A fine-tune whose every weight comes from init_from, and a resumed run, build their
    model without drawing initial weights (they would be overwritten); a classifier's new
    head is drawn."""
    import vaswani.models

    real, drawn = vaswani.models.init_weights, []
    monkeypatch.setattr(vaswani.models, "init_weights",
                        lambda *a, **k: drawn.append(1) or real(*a, **k))
    base_dir, text = small_runs["decoder"]
    before, after = one_step_from(base_dir, "decoder", text, tmp_path / "lm")
    assert not drawn and before.keys() == after.keys()
    train(None, ["train.max_steps=2"], resume=str(tmp_path / "lm"), launch=Launch(progress=False))
    assert not drawn
    data = classification_file(tmp_path / "c.tsv", n=20)
    one_step_from(small_runs["encoder"][0], "encoder", data, tmp_path / "clf")
    assert drawn == [1]
