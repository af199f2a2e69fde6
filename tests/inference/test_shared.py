"""Runs loaded together (inference/shared.py): LoRA runs of one base share one copy of it,
each answering as its merged model does alone."""

import pytest

import vaswani
from tests.training.fixtures import text_file
from tests.training.test_lora import LORA, _config, base, lora_run  # noqa: F401 (fixtures)
from vaswani.engine.adapters import choice_of
from vaswani.inference.shared import load_runs
from vaswani.training.train import Launch, train


@pytest.fixture(scope="module")
def second(base, tmp_path_factory):  # noqa: F811
    """Another LoRA run of the same base: other targets, rank and data."""
    folder = tmp_path_factory.mktemp("second")
    data = text_file(folder / "other.txt", seed=1)
    cfg = _config(folder / "b.toml", data, base[0], lr=3e-2, seed=7,
                  finetune={**LORA, "rank": 2, "targets": ["q", "v", "down"]})
    train(str(cfg), [], out=str(folder / "b"), launch=Launch(progress=False))
    return folder / "b"


def test_lora_runs_of_one_base_share_it_and_each_answers_as_merged(  # noqa: F811
        base, lora_run, second):  # noqa: F811
    said = []
    dirs = {"base": base[0], "a": lora_run, "b": second}
    runs = load_runs(dirs, say=said.append)
    assert runs["a"].model is runs["b"].model is runs["base"].model  # one copy of the base
    assert said == [f"a, b: LoRA adapters over one copy of {base[0].resolve()} (served as base)"]
    assert runs["a"].run_dir == lora_run and runs["a"].config.finetune.lora
    ids = runs["a"].source_tokenizer.encode_prompt("the cat sat on the mat")
    answers, scored = {}, {}
    for name, d in dirs.items():
        alone = vaswani.load(d)  # a LoRA run alone: merged into its base
        assert choice_of(alone.model) is None
        answers[name] = runs[name].generate("the", max_new_tokens=10, temperature=0)
        assert answers[name] == alone.generate("the", max_new_tokens=10, temperature=0)
        ours, theirs = runs[name].token_logprobs(ids, 2), alone.token_logprobs(ids, 2)
        scored[name] = [lp for lp, _ in ours]
        assert [lp for lp, _ in ours] == pytest.approx([lp for lp, _ in theirs], abs=1e-5)
        shown = [[p["p"] for p in run.output_probabilities("the cat")[1:]]
                 for run in (runs[name], alone)]  # (rounded to 5 decimals)
        assert shown[0] == pytest.approx(shown[1], abs=2e-5)
    for one, other in (("base", "a"), ("base", "b"), ("a", "b")):  # three models
        assert max(abs(x - y) for x, y in zip(scored[one], scored[other], strict=True)) > 1e-3
    # many prompts at once: the run's own offline engine, with its adapter
    assert runs["b"].generate_many(["the", "a"], max_new_tokens=10, temperature=0)[0] == \
        answers["b"]


def test_a_lone_lora_run_loads_merged_and_a_shared_base_decodes_eagerly(  # noqa: F811
        base, lora_run, second):  # noqa: F811
    alone = load_runs({"a": lora_run})["a"]
    assert choice_of(alone.model) is None
    params = sum(p.numel() for p in alone.model.parameters())
    shared = load_runs({"a": lora_run, "b": second})
    assert choice_of(shared["a"].model) is not None
    extra = sum(p.numel() for p in shared["a"].model.parameters()) - params
    assert 0 < extra < params / 4  # the base once and two adapters, not two models
    with pytest.raises(ValueError, match="decode eagerly"):
        load_runs({"a": lora_run, "b": second}, compiled=True)
