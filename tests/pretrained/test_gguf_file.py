"""vaswani's GGUF reader against PyPI gguf's own (writer and reader): every metadata type,
plain and quantized tensors, and a truncated file named as such."""

from __future__ import annotations

import numpy as np
import pytest

from vaswani.pretrained.gguf_file import GGUFFile

gguf = pytest.importorskip("gguf")


def _write(path):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -3)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 0.1)
    w.add_uint64("t.u64", 2 ** 60)
    w.add_int64("t.i64", -(2 ** 60))
    w.add_bool("t.bool", True)
    w.add_string("t.str", "ünïcode ▁ <0x0A> 🙂")
    w.add_array("t.strings", ["a", "", "▁b c", "🙂"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25, 3e-8])
    w.add_array("t.bools", [True, False])
    w.add_array("t.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    w.add_tensor("plain32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("plain16", rng.standard_normal((4, 2, 3)).astype(np.float16))
    q8 = rng.standard_normal((6, 64)).astype(np.float32)
    w.add_tensor("q8", gguf.quants.quantize(q8, gguf.GGMLQuantizationType.Q8_0),
                 raw_shape=gguf.quant_shape_to_byte_shape(q8.shape, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_reads_what_ggufs_own_reader_reads(tmp_path):
    path = _write(tmp_path / "m.gguf")
    ours, theirs = GGUFFile(path), gguf.GGUFReader(str(path))
    expected = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    expected["t.nested"] = [[1, 2], [3]]  # gguf's contents() flattens arrays of arrays
    assert ours.fields == expected
    assert ours.fields["t.u64"] == 2 ** 60 and ours.fields["t.str"] == "ünïcode ▁ <0x0A> 🙂"
    assert [t.name for t in ours.tensors] == ["plain32", "plain16", "q8"]
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        value = ours.read(mine)
        want = gguf.quants.dequantize(reference.data, reference.tensor_type)
        assert value.dtype == np.float32 and value.flags.writeable
        np.testing.assert_array_equal(value, want)
        assert value.shape == mine.shape


def test_a_truncated_file_is_named_as_such(tmp_path):
    path = _write(tmp_path / "m.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(ValueError, match="'q8' ends at byte .* past the file's end"):
        GGUFFile(path)
    path.write_bytes(b"GGML" + data[4:])
    with pytest.raises(ValueError, match="not a GGUF file of version 2 or 3"):
        GGUFFile(path)
