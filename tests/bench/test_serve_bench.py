"""benchmarks/serve.py's streaming part against a real ``vaswani serve`` of a tiny LM: every
client gets its whole completion, and the server runs on the device asked for (timing is
never asserted)."""

import json
import sys

import pytest
import torch

from benchmarks.serve import Server, attention_memory, stream


@pytest.fixture
def its_own_threads():
    """benchmarks/speculate.py measures with the 2 threads a process of its own gets; here it
    runs in the test's process (1 thread a worker under `make test`): put the count back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_streaming_clients_each_get_every_token(small_runs):
    run_dir, _ = small_runs["decoder"]
    with Server(run_dir, "lm", max_batch=4, device="cpu") as server:
        assert "--device" in server.process.args and "cpu" in server.process.args
        out = stream(server.url, clients=3, tokens=6, pid=server.process.pid)
    assert out["tokens"] == 18 and out["tokens_per_s"] > 0 and out["first_token_s"] > 0
    if sys.platform.startswith("linux"):  # the server's main thread ran, and no more
        assert 0 <= out["server_thread_us_per_token"] < (out["seconds"] + 0.02) / 18 * 1e6


def test_the_engines_own_short_among_long_runs_the_short_ones_among_all_the_long(small_runs):
    from benchmarks.serve_mixed import engine_short_among_long

    run_dir, _ = small_runs["decoder"]
    out = engine_short_among_long(run_dir, clients=3, repeats=2, max_batch=4)
    # inside, it asserts that each short request got its 8 tokens while all 3 long ones ran
    assert out["alone_s"] > 0
    assert out["ratio"] == pytest.approx(out["among_long_s"] / out["alone_s"], rel=1e-12)
    for where in ("alone", "among_long"):  # seven of the eight tokens come after the first
        assert 0 < out[f"per_token_{where}_s"] < out[f"{where}_s"] / 7


def test_the_background_streams_read_every_stream_to_its_end_and_report_failures(small_runs):
    from benchmarks.serve_mixed import Streams

    run_dir, _ = small_runs["decoder"]
    body = {"model": "lm", "prompt": "to be", "max_tokens": 6, "min_tokens": 6, "stream": True}
    with Server(run_dir, "lm", max_batch=4, device="cpu") as server:
        with Streams(server.url, body, 3) as streams:
            streams.wait()
        assert streams.running() == 0 and not streams.errors
        with Streams(server.url, {**body, "model": "nope"}, 2) as refused:
            with pytest.raises(AssertionError, match="404"):
                refused.wait()


def test_the_time_in_the_engine_is_read_from_metrics_and_is_part_of_the_clients(small_runs):
    import httpx

    from benchmarks.serve_mixed import engine_side, engine_time, per_token_time, send

    run_dir, _ = small_runs["decoder"]
    with Server(run_dir, "lm", max_batch=4, device="cpu") as server:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            before = engine_side(http)
            seconds = [send(http, ("complete", "to be", 8, False))["seconds"] for _ in range(3)]
            after = engine_side(http)
    assert after[2] - before[2] == 3  # three requests observed
    assert 0 < engine_time(before, after, 8) < max(seconds)
    assert engine_time(after, after, 8) is None  # none finished between
    assert 0 < per_token_time(before, after) < engine_time(before, after, 8) / 7
    assert per_token_time(after, after) is None


def test_each_round_is_kept_in_brief_beside_the_best():
    from benchmarks.serve_mixed import in_brief

    out = {"tokens_per_s": 1077.4, "first_token_p50_s": 0.026, "first_token_alone_s": 0.015,
           "short_among_long": {"alone_s": 0.02, "among_long_s": 0.075, "ratio": 3.69}}
    assert in_brief(out) == {"tokens_per_s": 1077.4, "first_token_s": [0.026, 0.015],
                             "short_s": [0.075, 0.02], "short_ratio": 3.69}


def test_the_explorers_memory_is_read_around_attention_calls_without_a_target(copy_run):
    with Server(copy_run[0], "copy", max_batch=4, device="cpu") as server:
        out = attention_memory(server.url, server.process.pid, "copy",
                               ["abcde", "bcd", "cdefg", "ab"] * 3, calls=2)
    if sys.platform.startswith("linux"):
        assert out["rss_serving_mb"] > 0 and out["rss_after_attention_mb"] > 0
        assert out["grew_mb"] == pytest.approx(out["rss_after_attention_mb"]
                                               - out["rss_serving_mb"], abs=0.11)
    else:
        assert out == {"rss_serving_mb": None, "rss_after_attention_mb": None, "grew_mb": None}


def test_the_prefill_part_times_a_short_request_alone_and_beside_a_long_prompt(small_runs,
                                                                               copy_run):
    """benchmarks/serve_prefill.py on tiny runs: a long prompt to the language model, a
    short translation on the other one; each round's time is measured (never asserted)."""
    import random

    from benchmarks.common import ServeProcess
    from benchmarks.serve_prefill import among_long

    lm, _ = small_runs["decoder"]
    with ServeProcess([str(copy_run[0]), str(lm), "--name", "copy", "--name", "lm"]) as server:
        alone, loaded = among_long(server.url, ("/v1/translate", {"model": "copy",
                                                                   "input": "abcdef"}),
                                   random.Random(0), rounds=2, model="lm", tokens=12)
    assert alone > 0 and len(loaded) == 2 and all(t > 0 for t in loaded)


def test_the_llm_benchmark_measures_one_precision_of_a_language_model(small_runs, tmp_path):
    """benchmarks/llm.py's measurement of one precision, on a tiny LM (float32 and int8), and
    its comparison of a compiled row's greedy tokens with eager's, in a run and afterwards
    on a results file (``--ties-of``)."""
    from benchmarks.llm import ANSWER_TOKENS, README_TOKENS, measure_one, readme_agreement, ties
    from vaswani.cpu.quantized import bf16_products

    lm, _ = small_runs["decoder"]
    for precision in ("fp32", "int8"):
        out = measure_one(str(lm), precision)
        assert out["prompt_tokens_per_s"] > 0 and out["generation_tokens_per_s"] > 0
        assert out["perplexity"] > 1 and out["peak_rss_mb"] > 0
        for tokens in ANSWER_TOKENS:
            assert len(out[f"answers_{tokens}"]) == 5
            assert 0 <= out[f"batch_of_16_equal_alone_{tokens}"] <= 16
        assert len(out["long_prompt_ids"]) > len(out["prompt_ids"]) > 0
        assert 0 < len(out["greedy_ids"]) <= 32
        readme = out[f"readme_ids_{README_TOKENS}"]
        assert len(readme) == 5
        assert all(len(prompt) > 0 and len(ids) <= README_TOKENS for prompt, ids in readme)
        # int8 widens its prompts by default where it can; the kernel's prompt timed too
        fast = precision == "int8" and bf16_products()
        assert out["fast_prefill"] is fast
        exact = out.get("exact_prefill")
        assert (exact is not None) == fast
        assert exact is None or exact["prompt_tokens_per_s"] > 0
    # a compiled row's continuations against its eager precision's: equal, or where they
    # part, eager's own token is the first of eager's two best there
    assert readme_agreement(lm, "int8", readme, readme) == {
        f"readme_{README_TOKENS}_as_eager": 5, f"readme_{README_TOKENS}_differences": []}
    k = max(range(5), key=lambda j: len(readme[j][1]))  # the longest continuation
    want = readme[k][1]
    i = min(3, len(want) - 1)
    other = [[prompt, list(ids)] for prompt, ids in readme]
    other[k][1][i] = (want[i] + 1) % 50
    got = readme_agreement(lm, "int8", readme, other)
    assert got[f"readme_{README_TOKENS}_as_eager"] == 4
    (parted,) = got[f"readme_{README_TOKENS}_differences"]
    assert parted["index"] == i and parted["eager"] == want[i]
    assert parted["compiled"] == other[k][1][i] and parted["eager_top_2"][0][0] == want[i]
    # a results file written before a difference was explained: --ties-of fills both in
    greedy = list(out["greedy_ids"])
    parted_greedy = greedy[:-1] + [(greedy[-1] + 1) % 50]  # the last token differs
    results = {"int8": out, "int8_compiled": {**out, "greedy_ids": parted_greedy,
                                              "prompt_ids": out["prompt_ids"][:8],  # fits
                                              f"readme_ids_{README_TOKENS}": other}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    ties(tmp_path / "results.json", lm)
    written = json.loads((tmp_path / "results.json").read_text())["int8_compiled"]
    assert written[f"readme_{README_TOKENS}_differences"] == [parted]
    assert written[f"readme_{README_TOKENS}_as_eager"] == 4
    assert written["first_difference_from_eager"]["index"] == len(greedy) - 1


def test_the_kv_cache_benchmark_measures_each_cache_after_each_context(small_runs):
    """benchmarks/kv_cache.py's measurement on a tiny LM (eager): a bfloat16 cache holds a
    token in half the bytes, and each context's greedy tokens and speed are there."""
    from benchmarks.kv_cache import measure

    lm, _ = small_runs["decoder"]
    plain = measure(str(lm), None, "float", "eager", contexts=(6, 12), new_tokens=5)
    half = measure(str(lm), None, "bf16", "eager", contexts=(6, 12), new_tokens=5)
    assert half["cache_bytes_per_token"] * 2 == plain["cache_bytes_per_token"]
    assert half["prompt_ids"] == plain["prompt_ids"] and len(plain["prompt_ids"]) == 12
    for out in (plain, half):
        assert set(out["contexts"]) == {"6", "12"}
        for row in out["contexts"].values():
            assert row["generation_tokens_per_s"] > 0 and 0 < len(row["greedy_ids"]) <= 5


def test_the_speculate_benchmark_times_plain_and_guessing_decoding_alike(small_runs,
                                                                          its_own_threads):
    """benchmarks/speculate.py's measurement on a tiny LM (int8, eager): the same tokens
    with and without guesses, and the guesses counted."""
    from benchmarks.speculate import measure

    lm, _ = small_runs["decoder"]
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    plain = measure(str(lm), False, prompt, 16, 0)
    fast = measure(str(lm), False, prompt, 16, 4)
    assert plain["ids"] == fast["ids"] and len(plain["ids"]) == plain["generated"] > 0
    assert plain["guessed"] == 0 and fast["passes"] > 0 and fast["guessed"] > 0
    assert fast["generation_tokens_per_s"] > 0 and not fast["compiled"]
    four = measure(str(lm), False, prompt, 16, 4, "int4")  # --quantize int4's weights
    assert four["generated"] > 0 and four["guessed"] > 0


def test_prompt_lookups_bound_replays_the_tokens_with_the_places_costs():
    """benchmarks/speculate.py's ``lookup_bound``: free places make a repeating output as fast
    as its passes are few; text seen nowhere before, or places that cost a step each, gain
    nothing."""
    from benchmarks.speculate import lookup_bound

    prompt = [5, 6, 7, 8, 9, 10, 11, 5, 6]
    free = {t: 1.0 for t in range(1, 10)}
    # after the first token (7 follows "5 6" as before), one pass of six guesses makes the
    # remaining seven
    assert lookup_bound(prompt, [7, 8, 9, 10, 11, 5, 6, 7], free) == 7.0
    assert lookup_bound(prompt, [20, 21, 22, 23], free) == 1.0  # nothing to look up
    assert lookup_bound(prompt, [7, 8, 9, 10], {t: float(t) for t in range(1, 10)}) == 1.0
    assert lookup_bound(prompt, [12, 5, 6, 13], free) == 1.0  # "12 5": seen nowhere
    assert lookup_bound(prompt, [12, 5, 6, 13], free, one_token=True) == 1.5  # "5": 6 holds


def test_the_speculate_benchmark_times_a_pass_of_each_number_of_places(small_runs,
                                                                        its_own_threads):
    """``--pass-costs`` on a tiny LM (int8 and int4, eager): one timing per number of places,
    and each relative to one place's."""
    from benchmarks.speculate import pass_costs

    lm, _ = small_runs["decoder"]
    for quantize in ("int8", "int4"):
        got = pass_costs(str(lm), False, [5, 6, 7, 8, 5, 6, 7, 8], places=4, repeats=2,
                         quantize=quantize)
        assert set(got["ms"]) == {1, 2, 3, 4} and got["steps"][1] == 1.0
        assert all(ms > 0 for ms in got["ms"].values()) and not got["compiled"]
        assert got["context"] == 8 and got["quantize"] == quantize


FAKE_LLAMA_CPP = """
class Llama:
    def __init__(self, model_path, n_threads, n_threads_batch, n_batch, verbose):
        assert n_threads == n_threads_batch == 2 and not verbose
        self.calls = []
    def reset(self):
        self.calls.append("reset")
    def token_eos(self):
        return 2
    def create_completion(self, prompt, max_tokens, stream=False, **greedy):
        assert greedy["temperature"] == 0.0 and greedy["repeat_penalty"] == 1.0
        assert self.calls[-1] == "reset"  # each timed call starts from an empty context
        self.calls.append("completion")
        chunks = [{"choices": [{"text": "x", "finish_reason": None}]}
                  for _ in range(max_tokens)]
        chunks.append({"choices": [{"text": "", "finish_reason": "length"}]})
        return iter(chunks) if stream else chunks[0]
    def generate(self, tokens, **greedy):
        yield from [7, 8, 9, 2, 5, 5]
"""


def test_the_llama_cpp_child_times_prompt_and_generation_and_reads_greedy_ids(tmp_path):
    """benchmarks/llama_cpp_child.py against a stand-in ``llama_cpp`` (the real one is
    built into a venv of its own by ``python -m benchmarks.llm``): its figures, and its
    greedy ids cut at end-of-sequence."""
    import json
    import os
    import subprocess
    import sys

    from benchmarks.common import first_difference

    (tmp_path / "llama_cpp.py").write_text(FAKE_LLAMA_CPP)
    job = {"gguf": "x.gguf", "threads": 2, "prompt": [1, 2, 3], "long_prompt": list(range(256)),
           "new_tokens": 16, "agree_tokens": 32}
    from benchmarks.common import ROOT

    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/llama_cpp_child.py"),
                          json.dumps(job)],
                         capture_output=True, text=True, check=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    result = json.loads(out.stdout)
    assert result["greedy_ids"] == [7, 8, 9, 2] and result["generated"] == 16
    assert result["prompt_tokens_per_s"] > 0 and result["generation_tokens_per_s"] > 0
    assert first_difference([7, 8, 9, 2], [7, 8, 1]) == 2
    assert first_difference([7, 8], [7, 8, 9]) == 2


def test_the_streams_benchmarks_clients_each_read_their_stream_to_the_end(small_runs):
    """benchmarks/streams.py's clients (llama-server's side needs its build: not here)."""
    import benchmarks.streams as streams
    from benchmarks.common import ServeProcess, stream_completions

    run_dir, _ = small_runs["decoder"]
    with ServeProcess([str(run_dir), "--name", "lm"]) as server:  # max_len 64: short prompts
        out = stream_completions(server.url, streams.prompts(3, chars=20), "lm", tokens=6)
    assert out["clients"] == 3 and out["tokens"] == 18 and out["first_token_s"] > 0
    assert out["text"] and out["tokens_per_s"] > 0
    texts = streams.prompts(8)  # each client's own, and the warm-up's
    assert len(set(texts)) == 9 and all(len(t) == 300 for t in texts)
    assert set(streams.prompts(8, same=True)) == {texts[0]}
    with pytest.raises(ValueError, match="prompts.md has 9000 characters: 30 clients"):
        streams.prompts(30)  # past the frozen text: refused, not empty prompts


def test_a_peer_server_that_exits_before_answering_is_named_with_its_stderr():
    import subprocess

    from benchmarks.common import free_port, wait_until_answers

    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('no model file')"],
                               stderr=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match="llama-server did not start: no model file"):
        wait_until_answers(f"http://127.0.0.1:{free_port()}/health", process, 60,
                           "llama-server")


def test_a_peer_server_answers_in_its_block_and_is_stopped_after_it():
    """benchmarks/common.py ``peer_server``, with Python's own HTTP server as the peer: the
    block gets its URL once it answers, and the process ends with the block, even when
    the block fails."""
    import httpx

    from benchmarks import common

    port = common.free_port()
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with pytest.raises(KeyError), common.peer_server(command, f"http://127.0.0.1:{port}", "/",
                                                     "http.server", 60) as url:
        assert httpx.get(url + "/", timeout=5).status_code == 200
        raise KeyError("the block failed")
    with pytest.raises(httpx.TransportError):  # stopped, not left listening
        httpx.get(url + "/", timeout=5)


@pytest.fixture(scope="module")
def wide_lm(small_runs, tmp_path_factory):
    """The small language model reading 512 positions (sinusoidal: no new weights), served
    under the name the prefix and vLLM parts ask for, with a chat template."""
    import shutil

    from tests.reliability.checkpoints import CHATML
    from vaswani import rundir

    wide = tmp_path_factory.mktemp("wide") / "lm"
    shutil.copytree(small_runs["decoder"][0], wide)
    config = wide / "config.toml"
    config.write_text(config.read_text().replace("max_len = 64", "max_len = 512", 1))
    (wide / rundir.CHAT_TEMPLATE).write_text(CHATML)
    with Server(wide, "smollm2", max_batch=16, device="cpu") as server:
        yield server


def test_the_prefix_part_counts_the_shared_prompt_once_and_times_each_turn(wide_lm):
    import random

    import httpx

    from benchmarks.serve_prefixes import chat, shared

    with httpx.Client(base_url=wide_lm.url, timeout=120) as http:
        many = shared(http, random.Random(1), tokens=60)
        talk = chat(http, 0, system=40, answers_of=4)
    assert len(many["texts"]) == 16 and many["prefix_hit_tokens"] > 0
    assert many["prefill_tokens"] + many["prefix_hit_tokens"] == many["prompt_tokens"]
    assert talk["sixth_turn_s"] > 0 and talk["new_turn_alone_s"] > 0
    assert len(talk["answers"]) == 5 and talk["history_tokens"] > 40


def test_the_vllm_parts_streams_each_get_every_token(wide_lm):
    from benchmarks.serve_vllm import TOKENS, streams

    out = streams(wide_lm.url, clients=3, per_client=2)
    assert out["tokens"] == 3 * 2 * TOKENS and out["first_token_p50_s"] > 0


def test_the_vllm_parts_texts_are_one_greedy_completion_a_prompt(wide_lm):
    import httpx

    from benchmarks.serve_vllm import AGREE, texts

    with httpx.Client(base_url=wide_lm.url, timeout=120) as http:
        first, again = texts(http), texts(http)
    assert len(first) == len(AGREE) and first == again  # greedy: the same each time


def test_llama_cpp_is_built_without_amx_only_where_the_cpu_has_amx():
    """benchmarks/common.py ``llama_cpp_build``: llama.cpp's default build (every instruction
    set of the CPU) where there is no AMX; on a CPU with AMX, the CPU's other instruction
    sets named one by one and AMX's kernels off (they die of SIGILL on some such hosts), in
    a venv of its own name, so that neither build is taken for the other."""
    from benchmarks.llama_cpp_peer import llama_cpp_build

    zen4 = {"avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512_vnni", "avx512_bf16"}
    assert llama_cpp_build("peer-1", zen4) == ("peer-1", None)
    xeon = zen4 | {"avx512_vbmi", "amx_tile", "amx_int8", "amx_bf16"}
    name, cmake = llama_cpp_build("peer-1", xeon)
    assert name not in ("peer-1", llama_cpp_build("peer-2", xeon)[0])
    options = set(cmake.split())
    assert {"-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
            "-DGGML_AMX_BF16=OFF"} <= options
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_BF16=ON",
            "-DGGML_AVX2=ON", "-DGGML_FMA=ON"} <= options
    assert "-DGGML_AVX_VNNI=ON" not in options  # an instruction set it lacks stays off
    assert not any(o.startswith("-DGGML_AMX") and o.endswith("=ON") for o in options)


DYING_LLAMA_CPP = """
import os, signal
class Llama:
    def __init__(self, **options):
        os.kill(os.getpid(), signal.SIGILL)  # as llama.cpp's AMX kernel dies on some hosts
"""


def test_the_speculate_benchmark_keeps_its_rows_when_llama_cpp_dies(small_runs, tmp_path,
                                                                     monkeypatch, capsys):
    """benchmarks/speculate.py's main loop with a llama.cpp whose process dies of SIGILL:
    vaswani's rows measured before and after it are reported and written, and llama.cpp's
    row says how its process ended (before, the traceback lost every row)."""
    import json

    import benchmarks.speculate as speculate
    from benchmarks.llama_cpp_peer import llama_cpp_child

    (tmp_path / "llama_cpp.py").write_text(DYING_LLAMA_CPP)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    got = llama_cpp_child(sys.executable, {"gguf": "x.gguf", "threads": 2})
    assert got["error"].startswith("llama.cpp's child failed (killed by signal 4)")

    lm, _ = small_runs["decoder"]
    calls = []

    def child(job):  # vaswani's rows, faked: their measurement is tested above
        calls.append(job["guesses"])
        return {"generation_tokens_per_s": 10.0 + len(calls), "ids": [5, 6, 7],
                "generated": 3, "guessed": job["guesses"], "accepted": 0}

    monkeypatch.setattr(speculate, "smollm2", lambda work: lm)
    monkeypatch.setattr(speculate, "child", child)
    monkeypatch.setattr(speculate, "llama_cpp_python", lambda: sys.executable)
    monkeypatch.setattr(speculate, "gguf_file", lambda: tmp_path / "x.gguf")
    monkeypatch.setattr(speculate, "q8_0_copy", lambda source, out: source)
    monkeypatch.setattr(speculate, "cpu_flags", lambda: {"avx2", "fma", "amx_tile"})
    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["speculate", "--no-compiled", "--rounds", "2",
                                      "--work", str(tmp_path), "--json", str(out)])
    speculate.main()
    results = json.loads(out.read_text())
    assert len(calls) == 2 * 2 * len(speculate.PROMPTS)  # two rows, two rounds, every prompt
    assert "killed by signal 4" in results["llama_cpp_error"]
    assert "-DGGML_AMX_TILE=OFF" in results["llama_cpp_build"]  # the build it ran, recorded
    for found in results["prompts"].values():
        assert set(found) == {"prompt_tokens", "eager", "eager, speculating"}
        assert found["eager"]["first_difference_from_eager"] is None
    assert "llama.cpp Q8_0" in capsys.readouterr().out


def test_the_llm_benchmark_compares_with_llama_cpp_only_where_its_process_ran():
    """benchmarks/llm.py ``versus_llama_cpp``: a row's ratios to llama.cpp's, and none
    (the row kept as it is) where llama.cpp's process failed."""
    from benchmarks.llm import versus_llama_cpp

    row = {"prompt_tokens_per_s": 300.0, "generation_tokens_per_s": 90.0,
           "greedy_ids": [1, 2, 3, 4], "exact_prefill": {"prompt_tokens_per_s": 150.0}}
    peer = {"prompt_tokens_per_s": 200.0, "generation_tokens_per_s": 60.0,
            "greedy_ids": [1, 2, 5]}
    words = versus_llama_cpp(row, peer, "q8_0")
    assert row["vs_llama_cpp"] == {"file": "q8_0", "prompt": 1.5, "generation": 1.5,
                                   "first_greedy_difference": 2, "prompt_exact_prefill": 0.75}
    assert len(words) == 2 and "1.5x its generation" in words[1]
    dead = {"prompt_tokens_per_s": 1.0}
    assert versus_llama_cpp(dead, {"error": "killed by signal 4"}, "q8_0") == []
    assert "vs_llama_cpp" not in dead
