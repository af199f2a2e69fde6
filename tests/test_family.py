"""A model family is one record (config/family.py): a toy family defined here, outside the
package, is built, checked, trained, loaded, refused the wrong work and routed by the server
from that record alone, and forgotten when it is taken away."""

import pytest

import vaswani
from tests.training.fixtures import config, text_file
from vaswani import ModelConfig, build_model
from vaswani.config.family import FAMILIES, Family, family, register
from vaswani.inference.base import WrongModel
from vaswani.inference.language_model import LanguageModel
from vaswani.models import DecoderLM
from vaswani.tasks.language_model import LanguageModelling


class ToyLM(DecoderLM):
    """A decoder-only language model under a family of its own."""


class ToyTask(LanguageModelling):
    name = "toy-lm"
    arch = "toy"


class ToyRun(LanguageModel):
    def shout(self, prompt: str) -> str:
        return self.generate(prompt, max_new_tokens=4, temperature=0).upper()


TOY = Family(name="toy", encoder=False, decoder=True, classes=False, model=ToyLM, task=ToyTask,
             use=ToyRun, routes=("completions",), describes="a toy language model",
             action="generate", summary="toy: continues your text")


@pytest.fixture
def toy():
    register(TOY)
    yield TOY
    FAMILIES.pop(TOY.name, None)


def small(**fields) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 40, "d_model": 16, "n_heads": 2, "d_ff": 32,
                          "n_layers": 1, "max_len": 32, **fields})


def test_a_family_is_known_only_while_registered(toy):
    assert family("toy") is toy and small(arch="toy").arch == "toy"
    del FAMILIES["toy"]
    with pytest.raises(ValueError, match=r"arch \('toy'\) must be one of 'encoder-decoder', "
                                         r"'decoder', 'encoder'"):
        small(arch="toy")
    register(toy)


def test_the_config_rules_and_the_model_follow_the_records_structure(toy):
    toy_config, decoder = small(arch="toy"), small(arch="decoder")
    assert toy_config.numbers() == decoder.numbers()  # the same structure, counted the same
    assert toy_config.n_decoder_layers == 1 and toy_config.n_encoder_layers is None
    model = build_model(toy_config)
    assert type(model) is ToyLM
    assert sum(p.numel() for p in model.parameters()) == \
        sum(p.numel() for p in build_model(decoder).parameters())
    with pytest.raises(ValueError, match="n_classes .* is only used by arch 'encoder'"):
        small(arch="toy", n_classes=3)
    with pytest.raises(ValueError, match="tgt_vocab_size .* only used by arch 'encoder-decoder'"):
        small(arch="toy", tgt_vocab_size=50)
    small(arch="toy", window={"size": 8})  # a decoder alone: a sliding window is allowed
    with pytest.raises(ValueError, match=r"\[model.window\] size .* arch 'decoder' or 'toy'"):
        small(arch="encoder", n_classes=2, window={"size": 8})


def test_a_toy_family_trains_loads_and_is_served_by_its_record(toy, tmp_path):
    from vaswani.serve.server import Limits, Refused, Server
    from vaswani.training.train import Launch, train

    data = text_file(tmp_path / "text.txt", n=300)
    cfg = config(tmp_path / "toy.toml", "toy", data, train={"max_steps": 4, "eval_every": 4,
                                                             "save_every": 4})
    summary = train(str(cfg), [], out=str(tmp_path / "run"), launch=Launch(progress=False),
                    cache=tmp_path / "cache")
    assert summary["steps"] == 4
    run = vaswani.load(tmp_path / "run")
    assert type(run) is ToyRun and type(run.model) is ToyLM and run.task.name == "toy-lm"
    assert run.describes == "a toy language model" and run.routes == ("completions",)
    assert run.shout("ab") == run.generate("ab", max_new_tokens=4, temperature=0).upper()
    with pytest.raises(WrongModel, match="holds a toy language model; translate needs a "
                                         r"translation model \(encoder-decoder\)"):
        run.translate(["ab"])
    server = Server({"toy": run}, max_batch=2, max_wait_ms=1, max_queue=4, limits=Limits())
    try:
        assert server.run_for("toy", "completions") is run
        with pytest.raises(Refused, match=r"'toy' is a toy language model; /v1/chat needs a "
                                          r"language model \(decoder\)"):
            server.run_for("toy", "chat")  # the record answers completions only
        with pytest.raises(Refused, match="/v1/embeddings needs an encoder"):
            server.run_for("toy", "embeddings")
    finally:
        server.close()
