"""The decode step compiled ahead of time (engine/compiled.py), built once per run with
``vaswani compile``: it gives each row the eager step's logits and every request the eager
engine's tokens (greedy, sampled, beam search; rows of unlike lengths; a translator's
sources by index), and a package built for anything else (another torch, CPU, weights) is
named and not used. Each build here is a real AOTInductor build (~30 s on 2 cores), one per
family."""

import dataclasses
import json
import shutil
import warnings
import zipfile

import pytest
import torch
from safetensors import safe_open
from torch.testing import assert_close

from tests.conftest import DEVICE
from vaswani import load, rundir
from vaswani.checkpoint.files import read_weights, write_tensors
from vaswani.cli import main
from vaswani.cpu.linear import USE_ONEDNN
from vaswani.engine import Engine, EngineConfig, Params, Request
from vaswani.engine import build as build_module
from vaswani.engine import compiled as compiled_module
from vaswani.engine.build import (
    FEW_GEMM,
    FEW_PARTS,
    FEW_ROWS_TRIED,
    INT8_ROWS_BLOCK,
    build,
    crossover,
    example_inputs,
    inductor_options,
    int8_blocking,
    probe_inputs,
    remove_package,
)
from vaswani.engine.compiled import (
    ROWS,
    SOURCE_PARTS,
    CompiledStep,
    DecodeStep,
    encoder_path,
    few_path,
)
from vaswani.engine.package import differences, package_path, record_path, unpacked
from vaswani.inference.compiled import compile_run
from vaswani.rundir import survey, written

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="a CPU's compiled step")


@pytest.fixture(scope="module")
def lm_run(small_runs, tmp_path_factory):
    """The small language model, copied, with its decode step built by `vaswani compile`."""
    run = tmp_path_factory.mktemp("compiled") / "lm"
    shutil.copytree(small_runs["decoder"][0], run)
    assert main(["compile", str(run)]) == 0
    return run


@pytest.fixture(scope="module")
def mt_run(copy_run, tmp_path_factory):
    """The copy-task translator, copied, with its float step and the companion for steps of
    a few rows built. The companion is timed against the step as every build times it, but
    kept for at least 8 rows whatever the timings say, so that the tests below can use it
    (the decision is :func:`test_the_few_row_package_takes_the_rows_it_was_faster_at`'s)."""
    run = tmp_path_factory.mktemp("compiled") / "mt"
    shutil.copytree(copy_run[0], run)
    timed = []

    def kept(*args, **kwargs):
        rows, timings = crossover(*args, **kwargs)
        timed.append(timings)
        return max(rows, 8), timings

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(build_module, "crossover", kept)
        out, seconds = compile_run(run, say=lambda message: None)
    assert out == package_path(run, None) and seconds > 0
    # timed at one thread and at this process's count (crossovers)
    assert len(timed) == len({1, torch.get_num_threads()})
    assert all(set(t) <= {str(n) for n in FEW_ROWS_TRIED} for t in timed)
    return run


def test_vaswani_compile_writes_the_package_and_its_record_in_the_run(lm_run, capsys):
    package = package_path(lm_run, None)
    record = json.loads(record_path(package).read_text())
    assert package.stat().st_size > 0
    assert record["torch"] == torch.__version__ and record["quantize"] is None
    assert record["capability"] == torch.backends.cpu.get_cpu_capability()
    # its library unpacked beside it, the one file of its kind there
    library = unpacked(package)
    assert [p.name for p in package.parent.glob("*.so")] == [library.name]
    with zipfile.ZipFile(package) as archive:
        assert library.read_bytes() == archive.read(
            next(name for name in archive.namelist() if name.endswith(".so")))
    # listed in the manifest: `--overwrite` of the run takes them away with it
    assert {"compiled/decode-float.pt2", "compiled/decode-float.json",
            "compiled/decode-*.so"} <= set(written(lm_run))
    assert not survey(lm_run)[1]  # nothing in compiled/ is in a new run's way
    # a language model's package has no companion and no encoder pass
    assert not few_path(package).exists() and not encoder_path(package).exists()


def rows_mid_way(run, prompts, **params):
    """An engine of ``run`` with every request prefilled and decoded a little (rows of
    unlike contexts), due for a decode step; a translator's prompts are its sources."""
    engine = run.new_engine(run.engine_for(8).config)
    if run.config.model.arch == "encoder-decoder":
        eos = run.source_tokenizer.eos_id
        greedy = dataclasses.replace(run.config.decode, beam=1)
        requests = [run.request(p + [eos], greedy) for p in prompts]
    else:
        requests = [Request(p, Params(max_new_tokens=30, **params)) for p in prompts]
    for r in requests:
        engine.submit(r)
    # (the copy task translates its short sources within a few steps)
    for _ in range(1 if run.config.model.arch == "encoder-decoder" else 3):
        engine.step()
    return engine, engine.scheduler.plan().decode


PROMPTS = {"lm": ["the cat", "a dog ran far away over the hills", "it"],
           # five rows (the step pads them to runs of equal size, compiled.py SOURCE_PARTS),
           # the longest source in the third run
           "mt": ["b c", "a b c", "e f g", "d e", "g h i j k l a b c d e"]}


@pytest.mark.parametrize("family", ["lm", "mt"])
def test_a_compiled_decode_step_gives_every_row_the_eager_steps_logits(family, request):
    run = load(request.getfixturevalue(f"{family}_run"))
    assert run.compiled is not None
    tok = run.source_tokenizer
    engine, rows = rows_mid_way(run, [tok.encode(t) for t in PROMPTS[family]])
    assert len(rows) == len(PROMPTS[family])
    assert_compiled_as_eager(engine, rows, run.compiled)


def assert_compiled_as_eager(engine, rows, compiled, rtol: float = 1e-4,
                             atol: float = 1e-4) -> None:
    """The compiled step over ``rows`` gives each the eager step's logits, within ``rtol``
    and ``atol``."""
    state = [t.clone() for t in engine.cache.k]  # the step writes the cache: run it twice
    engine.runner.compiled = None
    want, at = engine.runner.decode(rows)
    with torch.inference_mode():  # (the cache's tensors are inference tensors)
        for t, saved in zip(engine.cache.k, state, strict=True):
            t.copy_(saved)
    engine.runner.compiled = compiled
    got, at_compiled = engine.runner.decode(rows)
    assert at == at_compiled
    assert_close(got[at], want[at], rtol=rtol, atol=atol)


def test_a_translators_runs_of_rows_read_as_many_of_their_own_keys_as_their_longest(
        mt_run, monkeypatch):
    """Sentences admitted steps apart (as in a beam search, where new ones start beside
    hypotheses far along): each run of rows reads as many of its own keys as its longest
    row has (compiled.py SOURCE_PARTS), not the step's longest, and every row's logits are
    still the eager step's. The few-row companion takes them as one run (FEW_PARTS)."""
    run = load(mt_run)
    step = run.compiled
    assert step is not None and step.few is not None and step.few.parts == FEW_PARTS == 1
    engine = run.new_engine(run.engine_for(8).config)
    tok, greedy = run.source_tokenizer, dataclasses.replace(run.config.decode, beam=1)

    def submit(texts):
        for text in texts:
            engine.submit(run.request(tok.encode(text) + [tok.eos_id], greedy))
    submit(["g h i j k l a b c d e", "a b c d e f g h i j", "k l a b c d e f"])
    for _ in range(3):
        engine.step()
    submit(["b c d", "d e f g", "e f g h"])
    engine.step()
    rows = engine.scheduler.plan().decode
    positions = [seq.cached for _, seq in rows]
    # runs of more than one row (a short source may be done already), longest first
    assert len(rows) > SOURCE_PARTS and positions[0] > positions[-1]
    read = []  # the keys each run of rows read (the step's last inputs), and by which package
    for package in (step, step.few):
        boxed = package._boxed_run
        monkeypatch.setattr(package, "_boxed_run", lambda flat, p=package, boxed=boxed: (
            read.append((p, [t.numel() for t in flat[-p.parts:]])) or boxed(flat)))
    for package, few_rows in ((step, 0), (step.few, len(rows))):  # all rows to the one
        monkeypatch.setattr(step, "few_rows", few_rows)
        read.clear()
        assert_compiled_as_eager(engine, rows, step)
        # the rows in runs of one size, the last row again to fill them
        padded = positions + positions[-1:] * (-len(rows) % package.parts)
        size = len(padded) // package.parts
        assert read == [(package, [max(padded[i:i + size]) + 1
                                   for i in range(0, len(padded), size)])]
        if package is step:
            assert len(set(read[0][1])) > 1  # each run as long as its own longest row


@pytest.mark.parametrize("family", ["lm", "mt"])
def test_the_compiled_steps_attention_is_sums_that_read_the_cache_in_place(
        family, lm_run, mt_run):
    """The step's attention (one query a row) is sums of products that Inductor fuses with
    the rows' reads of their slots (cpu/attention.py ``one_query_attention``), not SDPA's
    kernel, which needs each row's keys gathered into a tensor of their own first."""
    model = load(lm_run if family == "lm" else mt_run, compiled=False).model
    args, shapes = example_inputs(model, family == "mt")
    with torch.no_grad():
        program = torch.export.export(DecodeStep(model).eval(), args, dynamic_shapes=shapes)
    called = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert not [name for name in called if "scaled_dot_product" in name]
    softmaxes = [name for name in called if "softmax" in name]
    # a translator's rows read their sources, and their own keys, in runs of rows, each
    # over its own keys
    parts = 2 * SOURCE_PARTS if family == "mt" else 1
    assert len(softmaxes) == parts * model.config.n_decoder_layers


@pytest.mark.parametrize("family", ["lm", "mt"])
def test_every_layers_cache_is_traced_with_the_steps_one_slot_count_and_width(
        family, small_runs, copy_run):
    """The engine's cache has one slot count and one width for every layer (cache.py), and
    the step is traced so: one size each, not two of their own for each layer's keys and
    values (export's AUTO), which Inductor reasons about apart, building the slower."""
    model = load(small_runs["decoder"][0] if family == "lm" else copy_run[0],
                 compiled=False).model
    args, shapes = example_inputs(model, family == "mt")
    with torch.no_grad():
        program = torch.export.export(DecodeStep(model).eval(), args, dynamic_shapes=shapes)
    inputs = set(program.graph_signature.user_inputs)
    sizes = {str(symbol) for node in program.graph.nodes if node.name in inputs
             for size in node.meta["val"].shape if isinstance(size, torch.SymInt)
             for symbol in size.node.expr.free_symbols}
    # rows, keys read, slots, width; a translator's too: sources' keys, source width, and
    # each run of rows' source keys and own keys (rows come in SOURCE_PARTS runs of one size)
    assert len(sizes) == (6 + 2 * SOURCE_PARTS if family == "mt" else 4), sizes


def test_float_weights_multiply_through_the_library_eager_uses_on_this_cpu(lm_run):
    """Float weights multiply through the library eager's products use on this CPU
    (cpu/linear.py ``USE_ONEDNN``; compiled.py ``GEMM``, ``PREPACK``): on Intel's, ATen's
    product over the weights as they are (MKL), elsewhere oneDNN's prepacked linear; never
    Inductor's C++ GEMM template, several times slower for a step of many rows
    (docs/performance.md)."""
    with zipfile.ZipFile(package_path(lm_run, None)) as package:
        code = "".join(package.read(name).decode() for name in package.namelist()
                       if name.endswith(".cpp"))
    atens = "aoti_torch_cpu_mm_out" in code or "aoti_torch_cpu_addmm_out" in code
    onednn = "linear_pointwise" in code
    assert (atens, onednn) == ((False, True) if USE_ONEDNN else (True, False))
    assert "micro_gemm" not in code


@pytest.mark.parametrize("onednn", [True, False])
def test_a_float_package_prepacks_its_weights_only_where_eager_uses_onednn(
        onednn, monkeypatch):
    """The float package's products follow eager's choice of library on each CPU: weights
    prepacked (Inductor's oneDNN linear) where cpu/linear.py multiplies through oneDNN, left
    as they are (ATen's product, MKL) where it uses ``F.linear``; quantized packages always
    prepack for their kernels, and so does a few-row companion on every CPU: Inductor's C++
    template offers no kernel for weights not prepacked (on an Intel CPU, where eager uses
    MKL, its build failed with NoValidChoicesError)."""
    monkeypatch.setattr(build_module, "USE_ONEDNN", onednn)
    assert inductor_options(None)["cpp.weight_prepack"] is onednn
    assert inductor_options(None)["max_autotune_gemm_backends"] == "ATEN"
    for quantize in ("int8", "int4", "int4-g64"):
        assert inductor_options(quantize)["cpp.weight_prepack"] is True
    few = inductor_options(None, FEW_GEMM)
    assert few["max_autotune_gemm_backends"] == "CPP" and few["cpp.weight_prepack"] is True


def test_a_step_of_more_rows_than_its_package_takes_runs_eagerly(lm_run):
    """A package takes steps of up to ``ROWS`` rows (compiled.py): a step past its package's
    rows does not call the package, a smaller one does."""
    run = load(lm_run)
    assert run.compiled.max_rows == ROWS
    calls = []
    step = run.compiled

    class Counted:  # the runner's calls, by their rows
        max_rows = 2

        def rows(self, cache, ids, *args):
            calls.append(len(ids))
            return step.rows(cache, ids, *args)

    run.compiled = Counted()
    prompts = ["the cat", "a dog", "it was"]
    assert run.generate_many(prompts, max_new_tokens=6, temperature=0) == \
        load(lm_run, compiled=False).generate_many(prompts, max_new_tokens=6, temperature=0)
    assert all(rows <= 2 for rows in calls)  # the steps of 3 rows ran eagerly
    before = len(calls)
    run.generate("the cat", max_new_tokens=4, temperature=0)
    assert len(calls) > before  # a step of one row: compiled


@pytest.mark.parametrize("library", [True, False], ids=["unpacked", "archive"])
def test_a_step_calls_the_packages_runner_with_its_tensors_flat(library, lm_run, mt_run,
                                                                monkeypatch, tmp_path):
    """A step hands the package's runner its input tensors as one flat list, in the order
    the package's own call would flatten them (the logits are the eager step's: the tests
    above). The runner opens the package's library unpacked beside it, never the archive
    (``aoti_load_package`` unpacks it anew at every load); a package without its library
    (a copy of the archive alone) is loaded from the archive, and called without its own
    ``__call__``'s parsing of the package's specs and pytree walk each step."""
    import torch._inductor
    from torch.export.pt2_archive._package import AOTICompiledModel

    def forbidden(*args, **kwargs):
        raise AssertionError("the archive's loader or its __call__ ran")

    runs = {lm_run: lm_run, mt_run: mt_run}
    if library:
        monkeypatch.setattr(torch._inductor, "aoti_load_package", forbidden)
    else:
        for run in runs:
            runs[run] = tmp_path / run.name
            shutil.copytree(run, runs[run])
            unpacked(package_path(runs[run], None)).unlink()
    monkeypatch.setattr(AOTICompiledModel, "__call__", forbidden)
    compiled = {run: load(copy) for run, copy in runs.items()}
    for run in runs:
        assert (compiled[run].compiled.library is not None) is library
    assert compiled[lm_run].generate("the cat", max_new_tokens=4, temperature=0) == \
        load(lm_run, compiled=False).generate("the cat", max_new_tokens=4, temperature=0)
    words = ["abc", "hello"]
    assert compiled[mt_run].translate(words, beam=2) == \
        load(mt_run, compiled=False).translate(words, beam=2)


def test_the_steps_weights_are_its_own_64_byte_aligned_copies(lm_run):
    """AOTInductor copies a library's weights into one block that malloc aligns to 16 bytes
    only; the step hands its runner copies in torch's 64-byte aligned memory instead, and
    the runner reads those (its constants are the step's tensors, every one of them, in
    memory of torch's allocator, not views of a block it was handed)."""
    step = load(lm_run).compiled
    assert step.library is not None
    runner = step._boxed_run.__self__
    mine = step._constants
    assert len(mine) == len(runner.get_constant_names_to_original_fqns()) > 0
    used = [t for t in runner.extract_constants_map(False).values()
            if t.layout == torch.strided]
    strided = [t for t in mine.values() if t.layout == torch.strided]
    assert strided and {t.data_ptr() for t in used} == {t.data_ptr() for t in strided}
    assert all(t.data_ptr() % 64 == 0 and t.untyped_storage().resizable() for t in used)


@pytest.mark.parametrize("damaged", ["package", "library"])
def test_a_damaged_package_or_library_is_named_and_the_run_still_decodes(damaged, lm_run,
                                                                         tmp_path):
    """A damaged archive: the run decodes eagerly; a library cut short (a copy stopped
    part-way; mapping it would fault the process): the package is loaded from its archive.
    Each is named in a warning that says how to rebuild it."""
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    package = package_path(run, None)
    path = package if damaged == "package" else unpacked(package)
    path.write_bytes(path.read_bytes()[:4096])
    with pytest.warns(UserWarning, match="cannot be loaded" if damaged == "package" else
                      "is not the whole library") as caught:
        loaded = load(run)
    assert (loaded.compiled is None) is (damaged == "package")
    assert str(path) in str(caught[0].message)
    assert f"vaswani compile {run}" in str(caught[0].message)
    assert loaded.generate("the cat", max_new_tokens=4, temperature=0) == \
        load(lm_run, compiled=False).generate("the cat", max_new_tokens=4, temperature=0)


def test_compiled_generation_equals_eager_token_for_token(lm_run):
    compiled, eager = load(lm_run), load(lm_run, compiled=False)
    assert compiled.compiled is not None and eager.compiled is None
    prompts = ["the cat sat", "once upon a time there was", "a", "the dog and the cat and"]
    for options in (dict(temperature=0), dict(temperature=0.9, top_k=20, seed=3)):
        assert compiled.generate_many(prompts, max_new_tokens=24, **options) == \
            eager.generate_many(prompts, max_new_tokens=24, **options)
    streamed = []
    assert compiled.generate("the cat", max_new_tokens=16, temperature=0,
                             stream=streamed.append) == eager.generate(
        "the cat", max_new_tokens=16, temperature=0)


def test_a_compiled_translator_decodes_greedy_and_beam_as_eager(mt_run):
    compiled, eager = load(mt_run), load(mt_run, compiled=False)
    assert compiled.compiled is not None
    lines = ["a b c d", "e f", "", "g h i j k l", "b"]
    for beam in (1, 4):
        assert compiled.translate(lines, beam=beam) == eager.translate(lines, beam=beam)


@pytest.fixture(scope="module")
def int8_run(lm_run):
    """The small language model with its int8 decode step built too."""
    assert main(["compile", str(lm_run), "--quantize", "int8"]) == 0
    return lm_run


def test_the_int8_blocking_is_pinned_while_inside_and_restored_after():
    """compiled.py ``int8_blocking``: Inductor's AVX-512 bfloat16 x int8 kernel offers one
    blocking, ours, while a package is built (whatever this CPU), and its own list after."""
    import torch._inductor.compile_fx  # noqa: F401
    from torch._inductor.codegen import cpp_micro_gemm as micro
    from torch._inductor.cpu_vec_isa import VecAVX512

    def blockings():
        return sorted(tuple(c.register_blocking) for configs in micro.micro_gemm_configs.values()
                      for c in configs if c.vec_isa_cls is VecAVX512
                      and c.input2_dtype == torch.int8 and c.input_dtype == torch.bfloat16
                      and c.register_blocking.block_k == 1)
    before = blockings()
    assert (8, 48, 1) in before
    with int8_blocking():
        assert blockings() == [INT8_ROWS_BLOCK]
    assert blockings() == before


def test_int8_weights_compile_to_the_eager_steps_logits_within_bfloat16s_rounding(int8_run):
    """Inductor's int8 template keeps the products in float32 where ATen's kernel rounds
    them to bfloat16, so logits differ by bfloat16's steps, not more."""
    run = load(int8_run, quantize="int8")
    assert run.compiled is not None and run.compiled.path.name == "decode-int8.pt2"
    assert run.compiled.max_rows == ROWS  # as a float package: steps of any size compiled
    tok = run.source_tokenizer
    engine, rows = rows_mid_way(run, [tok.encode(t) for t in ["the cat", "a dog ran", "it"]])
    assert_compiled_as_eager(engine, rows, run.compiled, rtol=2 ** -7, atol=0.05)


def test_an_int8_compiled_rows_logits_are_the_same_bits_alone_and_in_a_batch(tmp_path,
                                                                           two_threads):
    """The compiled step computes row by row too, whatever the batch's rows and longest row
    (the eager engine's own test, on the same model: test_runner.py)."""
    from tests.engine.test_runner import int8_model, prompts

    model = int8_model()
    build(model, False, tmp_path / "step.pt2", {}, lambda message: None, "int8")
    step = CompiledStep(tmp_path / "step.pt2")
    with zipfile.ZipFile(tmp_path / "step.pt2") as package:
        source = "".join(package.read(name).decode() for name in package.namelist()
                         if name.endswith(".cpp"))
    if torch.cpu._is_amx_tile_supported():  # AMX's tiles, as Inductor chooses them
        assert "micro_gemm_amx_kernel" in source
    elif torch.backends.cpu.get_cpu_capability() == "AVX512":  # the kernel's blocks of rows
        assert "micro_gemm_kernel<4, 48, accum" in source, "blocks of 4 rows (INT8_ROWS_BLOCK)"
        assert "micro_gemm_kernel<8, 48, accum" not in source

    def logprobs(batch):
        engine = Engine(model, bos_id=1, eos_id=2, config=EngineConfig())
        engine.runner.compiled = step
        requests = [Request(p, Params(max_new_tokens=10, logprobs=3)) for p in batch]
        engine.run(requests)
        return [(r.output, r.logprobs) for r in requests]

    batch = prompts()
    together = logprobs(batch)
    for i in (0, 5, 11, 23):
        assert logprobs([batch[i]]) == [together[i]]
    # guesses checked by the compiled step, a row of it for each place: each place's logits
    # are its plain step's bits, so every token and log-probability is plain decoding's
    from tests.engine.test_speculate import repeating

    def decode(speculate):
        engine = Engine(model, bos_id=1, eos_id=2, config=EngineConfig())
        engine.runner.compiled = step
        requests = [Request(p, Params(max_new_tokens=30, speculate=speculate, logprobs=3,
                                      **({"temperature": 0.9, "seed": i} if i % 2 else {})))
                    for i, p in enumerate(repeating(6))]
        engine.run(requests)
        return [(r.output, r.logprobs) for r in requests], engine

    (plain, _), (guessed, engine) = decode(0), decode(6)
    assert guessed == plain
    assert engine.speculation.accepted > 10  # tokens taken from places past a row's own


def test_a_translators_int8_step_is_refused_by_name(mt_run):
    with pytest.raises(ValueError, match="compile its float step"):
        compile_run(mt_run, quantize="int8")


def test_a_package_built_for_something_else_is_named_and_not_used(lm_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    record = record_path(package_path(run, None))
    built = json.loads(record.read_text())
    for key, value, named in [("torch", "2.0.0", "torch ('2.0.0'"),
                              ("cpu_flags", "sse2", "CPU instruction sets"),
                              ("code", "0" * 64, "vaswani's code"),
                              ("weights_mtime_ns", 1, "weights (changed since)")]:
        other = {"weights_sha256": "0" * 64} if key == "weights_mtime_ns" else {}
        record.write_text(json.dumps({**built, key: value, **other}))
        with pytest.warns(UserWarning, match=r"does not match what is loaded now: .*") as caught:
            assert load(run).compiled is None  # eager, never the package
        message = str(caught[0].message)
        assert named in message and f"vaswani compile {run}" in message
    record.write_text(json.dumps(built))
    assert load(run).compiled is not None


def test_a_run_copied_without_its_files_times_keeps_its_packages(mt_run, tmp_path):
    """``cp -r`` gives the weights a new modification time, not new bytes: the step and its
    companions are used (their records hold the weights' sha256) and their records take the
    new time; while the run is in use by another process they are used and left as they
    are. Weights of the same size but other bytes, or a record written before records held
    the sha256, are refused on the time, as before."""
    run = tmp_path / "run"
    shutil.copytree(mt_run, run, copy_function=shutil.copyfile)  # (times not kept)
    weights = run / "model.safetensors"
    step = package_path(run, None)
    records = [record_path(p) for p in (step, few_path(step), encoder_path(step))]
    now = weights.stat().st_mtime_ns
    assert all(json.loads(r.read_text())["weights_mtime_ns"] != now for r in records)
    with rundir.locked(run), warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: every package used
        loaded = load(run).compiled
    assert loaded is not None and loaded.few is not None and loaded.encoder is not None
    assert all(json.loads(r.read_text())["weights_mtime_ns"] != now for r in records)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load(run).translate(["a b c"]) == load(mt_run, compiled=False).translate(
            ["a b c"])
    assert all(json.loads(r.read_text())["weights_mtime_ns"] == now for r in records)

    original = weights.read_bytes()
    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata()
    tensors = read_weights(weights)
    name = next(iter(tensors))
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = torch.nextafter(tensors[name].view(-1)[0], torch.tensor(1.0))
    write_tensors(weights, tensors, {k: v for k, v in metadata.items() if k != "sha256"})
    assert weights.stat().st_size == len(original) and weights.read_bytes() != original
    with pytest.warns(UserWarning, match=r"weights \(changed since\); running eagerly"):
        assert load(run).compiled is None
    weights.write_bytes(original)  # its bytes again, under a third time
    built = json.loads(records[0].read_text())
    del built["weights_sha256"]  # (as records were written before)
    records[0].write_text(json.dumps(built))
    with pytest.warns(UserWarning, match=r"weights \(changed since\); running eagerly"):
        assert load(run).compiled is None


def test_every_engine_of_the_run_decodes_with_its_package(lm_run):
    """The server's engines too (serve/ makes them with ``Run.new_engine``)."""
    run = load(lm_run)
    assert run.new_engine(EngineConfig(max_rows=4)).runner.compiled is run.compiled
    assert run.engine_for(3).runner.compiled is run.compiled


def test_a_package_of_other_weights_of_the_run_is_not_used(lm_run):
    """Built for the best weights, a load of the last checkpoint's (another file) decodes
    eagerly, naming the file."""
    with pytest.warns(UserWarning, match="weights file .'model.safetensors' -> "
                                         "'last/model.safetensors'"):
        assert load(lm_run, weights="last").compiled is None


def test_compiled_true_needs_a_package_and_false_ignores_one(lm_run, small_runs):
    with pytest.raises(FileNotFoundError, match="vaswani compile"):
        load(small_runs["decoder"][0], compiled=True)
    assert load(lm_run, compiled=False).compiled is None
    assert load(lm_run, compiled=True).compiled is not None
    with pytest.raises(FileNotFoundError, match="--quantize int4"):
        load(lm_run, quantize="int4", compiled=True)


def test_the_differences_are_said_in_words():
    assert differences({"torch": "2.12.0", "config": "a"},
                       {"torch": "2.13.0", "config": "b"}) == [
        "torch ('2.12.0' -> '2.13.0')", "config.toml"]


def test_the_cli_says_where_it_built_and_eager_is_a_switch(lm_run, capsys):
    assert main(["generate", str(lm_run), "--prompt", "the", "--max-new-tokens", "4",
                 "--eager"]) == 0
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    assert "AOTInductor" in capsys.readouterr().out


@pytest.fixture(scope="module")
def kv_run(lm_run, tmp_path_factory):
    """The compiled language model with a second package: its step over a bfloat16 cache."""
    run = tmp_path_factory.mktemp("compiled") / "kv"
    shutil.copytree(lm_run, run)
    with pytest.raises(FileNotFoundError, match="--kv-cache bf16"):
        load(run, kv_cache="bf16", compiled=True)  # the float cache's package is not it
    assert main(["compile", str(run), "--kv-cache", "bf16"]) == 0
    return run


@pytest.mark.slow
def test_a_step_over_a_bfloat16_cache_is_a_package_of_its_own_and_decodes_as_eager(
        kv_run, capsys):
    """`vaswani compile RUN --kv-cache bf16` builds a package beside the float cache's; a
    load with ``kv_cache="bf16"`` decodes with it, over a bfloat16 cache, to the eager
    engine's tokens over the same cache (greedy and sampled); the float load keeps its own."""
    package = package_path(kv_run, None, "bf16")
    assert package.name == "decode-float-kv-bf16.pt2"
    assert json.loads(record_path(package).read_text())["kv_cache"] == "bf16"
    half, eager = load(kv_run, kv_cache="bf16"), load(kv_run, kv_cache="bf16", compiled=False)
    assert half.compiled.path == package
    assert load(kv_run).compiled.path == package_path(kv_run, None)
    assert half.engine_for(4).cache.k[0].dtype == torch.bfloat16
    prompts = ["the cat sat", "once upon a time there was", "a", "the dog and the cat and"]
    for options in (dict(temperature=0), dict(temperature=0.9, top_k=20, seed=3)):
        assert half.generate_many(prompts, max_new_tokens=24, **options) == \
            eager.generate_many(prompts, max_new_tokens=24, **options)
    with pytest.raises(ValueError, match=r"kv_cache \('fp8'\) must be one of bf16"):
        load(kv_run, kv_cache="fp8")
    assert main(["generate", str(kv_run), "--prompt", "the", "--max-new-tokens", "4",
                 "--kv-cache", "bf16"]) == 0
    assert capsys.readouterr().out.strip()


class _SharedNamesRunner:
    """A loaded library's runner as own_constants sees it, in which two constants share one
    original name (as Inductor's C++ GEMM template writes them for float products)."""

    def __init__(self):
        self.calls = []

    def get_constant_names_to_original_fqns(self):
        return {"constant3": "constant3", "constant3_0": "constant3", "w": "model.w"}

    def extract_constants_map(self, use_inactive):
        return {"constant3": torch.ones(4), "model.w": torch.zeros(4)}

    def __getattr__(self, name):  # update_constant_buffer, swap_constant_buffer, ...
        return lambda *args: self.calls.append(name)


def test_a_library_whose_constants_share_a_name_keeps_them_where_it_loaded_them():
    """Handing the runner copies by name would leave one of two constants of one name empty
    (a crash at the next step): such a library's constants stay as loaded, untouched."""
    runner = _SharedNamesRunner()
    assert compiled_module.own_constants(runner) == {}
    assert runner.calls == []


# --- a translator's steps of a few rows ------------------------------------------------------

def test_a_translators_float_step_has_a_companion_for_steps_of_a_few_rows(mt_run):
    """`vaswani compile` of a translator builds a second package beside its float step, its
    products through Inductor's C++ GEMM template, with a record of the rows it takes and
    the times both took at each size tried; the run loads both."""
    package = package_path(mt_run, None)
    few = few_path(package)
    assert few.name == "decode-float-few.pt2"
    record = json.loads(record_path(few).read_text())
    main_record = json.loads(record_path(package).read_text())
    assert record["gemm"] == FEW_GEMM == "CPP"
    assert record["parts"] == FEW_PARTS  # its rows in one run
    assert {k: v for k, v in record.items() if k not in ("gemm", "parts", "by_threads")} == \
        {k: v for k, v in main_record.items() if k != "build_seconds"}
    # the rows it takes and the times both took, at one thread and at the build's count
    threads = torch.get_num_threads()
    by_threads = record["by_threads"]
    assert set(by_threads) == {"1", str(threads)}
    for entry in by_threads.values():
        assert entry["rows"] >= 8 and entry["step_ms"]
        assert all(len(pair) == 2 and min(pair) > 0 for pair in entry["step_ms"].values())
    assert unpacked(few).exists() and unpacked(few) != unpacked(package)
    assert {"compiled/decode-float-few.pt2", "compiled/decode-float-few.json"} <= \
        {p.relative_to(mt_run).as_posix() for p in mt_run.glob("compiled/*")}
    assert not survey(mt_run)[1]
    step = load(mt_run).compiled
    assert step.few is not None and step.few.path == few
    assert step.few_limits == {int(n): entry["rows"] for n, entry in by_threads.items()}
    assert step.few_rows == by_threads[str(threads)]["rows"]
    assert step.parts == SOURCE_PARTS and step.few.parts == FEW_PARTS
    assert inductor_options(None, FEW_GEMM)["max_autotune_gemm_backends"] == "CPP"


def test_steps_of_a_few_rows_run_the_companion_to_the_eager_steps_logits(mt_run):
    """A step of at most ``few_rows`` rows runs the companion package, not the step's own
    (their runners counted), and gives every row the eager step's logits; with
    ``few_rows`` 0 the step's own package runs it."""
    run = load(mt_run)
    step = run.compiled
    tok = run.source_tokenizer
    engine, rows = rows_mid_way(run, [tok.encode(t) for t in PROMPTS["mt"]])
    assert len(rows) <= step.few_rows
    calls = []
    for name, package in (("step", step), ("few", step.few)):
        runner = package._boxed_run
        package._boxed_run = lambda flat, runner=runner, name=name: (
            calls.append(name), runner(flat))[1]
    state = [t.clone() for t in engine.cache.k]  # each pass writes the cache: restore it
    results = {}
    for kind, few_rows in (("eager", None), ("few", step.few_rows), ("step", 0)):
        with torch.inference_mode():
            for t, saved in zip(engine.cache.k, state, strict=True):
                t.copy_(saved)
        engine.runner.compiled = None if few_rows is None else step
        step.few_rows = few_rows or 0
        calls.clear()
        results[kind] = engine.runner.decode(rows)
        assert calls == ([] if few_rows is None else [kind])
    want, at = results["eager"]
    for kind in ("few", "step"):
        got, at_compiled = results[kind]
        assert at_compiled == at
        assert_close(got[at], want[at], rtol=1e-4, atol=1e-4)


def test_a_sentence_translated_alone_is_one_row_of_the_companions_steps(mt_run, monkeypatch):
    """The few-row companion takes its rows as one run (build.py FEW_PARTS), so a greedy
    sentence alone is a step of one row, not of SOURCE_PARTS (its row again to fill the
    runs, each multiplied by every weight); the translation is eager's."""
    compiled = load(mt_run)
    few = compiled.compiled.few
    rows = []
    boxed = few._boxed_run
    monkeypatch.setattr(few, "_boxed_run", lambda flat: rows.append(flat[0].size(0)) or boxed(flat))
    got = compiled.translate(["a b c d e"], beam=1)
    assert rows and set(rows) == {1}
    assert got == load(mt_run, compiled=False).translate(["a b c d e"], beam=1)


def test_a_compiled_translator_with_and_without_its_few_row_step_decodes_as_eager(mt_run):
    compiled, eager = load(mt_run), load(mt_run, compiled=False)
    lines = ["a b c d", "e f", "g h i j k l", "b"]
    for few_rows in (compiled.compiled.few_rows, 0):
        compiled.compiled.few_rows = few_rows
        for beam in (1, 4):
            assert compiled.translate(lines, beam=beam) == eager.translate(lines, beam=beam)


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize("faster_up_to", [0, 4, 12, 32])
def test_the_few_row_package_takes_the_rows_it_was_faster_at(faster_up_to, mt_run,
                                                             monkeypatch):
    """The crossover times both packages at each size tried, smallest first, and keeps the
    companion for the sizes up to the last where it was the faster (0: none); sizes past
    the first where it was not are not timed. A clock the fake steps advance stands in for
    the machine's."""
    clock = _Clock()
    monkeypatch.setattr(build_module.time, "perf_counter", clock)
    sizes = []

    class package:  # noqa: N801  (a package's rows(), as crossover calls it)
        def __init__(self, faster: bool) -> None:
            self.faster = faster

        def rows(self, cache, ids, *args):
            rows = len(ids)
            sizes.append(rows)
            clock.now += 1.0 if self.faster == (rows <= faster_up_to) else 2.0

    model = load(mt_run, compiled=False).model
    rows, timings = crossover(package(False), package(True), model, rounds=3)
    assert rows == faster_up_to
    timed = [n for n in FEW_ROWS_TRIED if n <= faster_up_to] + \
        [n for n in FEW_ROWS_TRIED if n > faster_up_to][:1]
    assert list(timings) == [str(n) for n in timed] and sorted(set(sizes)) == timed
    for n in timed:
        assert timings[str(n)] == ([2000.0, 1000.0] if n <= faster_up_to else [1000.0, 2000.0])
    cache, args = probe_inputs(model, 8)
    assert len(args[0]) == 8 and cache.k[0].size(0) == 8 and cache.seq2seq


@pytest.mark.parametrize("threads", [2, 3])
def test_the_crossover_is_timed_at_one_thread_and_at_the_builds(threads, mt_run, monkeypatch):
    """A worker of ``--workers N`` decodes on 1/N of the threads, where the companion is the
    faster up to fewer rows: the build times the two at one thread and at its own count
    (the count restored after, also when a timing fails), and the message says both."""
    clock, seen = _Clock(), []
    monkeypatch.setattr(build_module.time, "perf_counter", clock)

    class package:  # noqa: N801  (faster up to 16 rows at its build's count, 4 at one)
        def __init__(self, faster: bool) -> None:
            self.faster = faster

        def rows(self, cache, ids, *args):
            seen.append(torch.get_num_threads())
            up_to = 4 if torch.get_num_threads() == 1 else 16
            clock.now += 1.0 if self.faster == (len(ids) <= up_to) else 2.0

    model = load(mt_run, compiled=False).model
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        found = build_module.crossovers(package(False), package(True), model)
        assert torch.get_num_threads() == threads and set(seen) == {1, threads}
        limits = {n: rows for n, (rows, _) in found.items()}
        assert limits == {1: 4, threads: 16}
        assert build_module.few_rows_text(limits) == "up to 16 rows, 4 at 1 thread"
        assert build_module.few_rows_text({1: 8, threads: 8}) == "up to 8 rows"

        def failing(*args, **kwargs):
            raise RuntimeError("a timing failed")
        monkeypatch.setattr(build_module, "crossover", failing)
        with pytest.raises(RuntimeError):
            build_module.crossovers(package(False), package(True), model)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_the_step_runs_a_few_rows_by_the_limit_of_its_thread_count(mt_run):
    """The companion's limit at this process's thread count is the one timed at the most
    threads not above it; a record written before limits by thread count has one for all;
    a record without a whole limit has none (the run warns and decodes without it)."""
    step = load(mt_run).compiled
    limits, before = step.few_limits, torch.get_num_threads()
    try:
        step.few_limits = {1: 4, 2: 12}
        for threads, rows in ((1, 4), (2, 12), (3, 12)):
            torch.set_num_threads(threads)
            assert step.few_rows == rows
        step.few_rows = 6  # a limit set by hand holds at every count
        assert step.few_limits == {1: 6} and step.few_rows == 6
    finally:
        step.few_limits = limits
        torch.set_num_threads(before)
    few_limits = compiled_module.few_limits
    assert few_limits({"rows": 12}) == {1: 12}  # a record of an earlier version
    assert few_limits({"by_threads": {"1": {"rows": 4}, "2": {"rows": 16}}}) == {1: 4, 2: 16}
    for broken in ({}, {"rows": "12"}, {"by_threads": {}}, {"by_threads": {"1": {}}},
                   {"by_threads": {"one": {"rows": 4}}}, {"by_threads": [4]},
                   {"by_threads": {"1": {"rows": 4.0}}}):
        assert few_limits(broken) is None, broken


COMPANIONS = {"few": (few_path, "steps of a few rows run as the others"),
              "encoder": (encoder_path, "sources are encoded eagerly")}


def without(step, part: str) -> bool:
    return step.few is None and step.few_rows == 0 if part == "few" else step.encoder is None


@pytest.mark.parametrize("part", list(COMPANIONS))
def test_a_run_compiled_before_a_companion_package_loads_without_it(part, mt_run, tmp_path):
    """A run compiled by an earlier version has no companion for a few rows and no encoder
    pass: it loads its step without them and decodes as before; ``remove_package`` takes a
    package, its record and its library."""
    run = tmp_path / "run"
    shutil.copytree(mt_run, run)
    companion = COMPANIONS[part][0](package_path(run, None))
    library = unpacked(companion)
    remove_package(companion)
    assert not companion.exists() and not record_path(companion).exists()
    assert not library.exists()
    assert unpacked(package_path(run, None)).exists()  # the step's own library stays
    step = load(run).compiled
    assert step is not None and without(step, part) and not without(step, (
        set(COMPANIONS) - {part}).pop())
    assert load(run).translate(["a b c"]) == load(mt_run, compiled=False).translate(["a b c"])


@pytest.mark.parametrize("part", list(COMPANIONS))
def test_a_companion_package_built_for_something_else_is_named_and_not_used(part, mt_run,
                                                                            tmp_path):
    run = tmp_path / "run"
    shutil.copytree(mt_run, run)
    companion, otherwise = COMPANIONS[part]
    companion = companion(package_path(run, None))
    record = json.loads(record_path(companion).read_text())
    record_path(companion).write_text(json.dumps({**record, "torch": "2.0.0"}))
    with pytest.warns(UserWarning, match=otherwise) as caught:
        step = load(run).compiled
    message = str(caught[0].message)
    assert str(companion) in message and "torch ('2.0.0'" in message
    assert step is not None and without(step, part)


# --- a translator's encoder pass --------------------------------------------------------------

def test_a_translators_encoder_pass_is_compiled_beside_its_step(mt_run):
    """`vaswani compile` of a translator builds its encoder pass too (decode-float-encoder.pt2,
    its record the step's identity), which the run loads with its step."""
    package = package_path(mt_run, None)
    encoder = encoder_path(package)
    assert encoder.name == "decode-float-encoder.pt2" and unpacked(encoder).exists()
    record = json.loads(record_path(package).read_text())
    assert json.loads(record_path(encoder).read_text()) == \
        {k: v for k, v in record.items() if k != "build_seconds"}
    step = load(mt_run).compiled
    assert step.encoder is not None and step.encoder.path == encoder


def test_the_compiled_encoder_pass_writes_the_eager_ones_keys_and_values(mt_run):
    """Sources of unlike lengths (one of a single token, <eos> alone, which the pass was not
    traced for) encoded with the compiled pass and eagerly: every source slot holds the
    same keys and values within float32's rounding; the package ran for the groups of two
    tokens or more only (its runner counted)."""
    run = load(mt_run)
    step = run.compiled
    runner, calls = step.encoder._boxed_run, []
    step.encoder._boxed_run = lambda flat: (calls.append(flat[0].shape), runner(flat))[1]
    tok = run.source_tokenizer
    sources = [tok.encode(t) + [tok.eos_id] for t in ["a b c d e", "b", "g h i j k l a b"]]
    sources.append([tok.eos_id])
    stores = {}
    for kind in ("compiled", "eager"):
        engine = run.new_engine(run.engine_for(8).config)
        if kind == "eager":
            engine.runner.compiled = None
        requests = [Request(s, Params(max_new_tokens=0), start=[tok.bos_id], limit=5)
                    for s in sources]
        for r in requests:
            engine.cache.take_source(r, len(r.prompt))
        engine.runner.encode(requests[:3])
        engine.runner.encode(requests[3:])  # <eos> alone
        stores[kind] = [(engine.cache.ck[i][r.source_slot, :, :len(r.prompt)],
                         engine.cache.cv[i][r.source_slot, :, :len(r.prompt)])
                        for r in requests for i in range(len(engine.cache.ck))]
    assert [shape[1] for shape in calls] == [max(len(s) for s in sources[:3])]
    for (k, v), (k_eager, v_eager) in zip(stores["compiled"], stores["eager"], strict=True):
        assert_close(k, k_eager, rtol=1e-5, atol=1e-5)
        assert_close(v, v_eager, rtol=1e-5, atol=1e-5)
