"""benchmarks/data.py: each row it writes names the machine and the day it was measured on
(rows of earlier calls, kept beside it, may come from other machines)."""

import json

from benchmarks import data


def test_each_row_says_its_machine_and_date_and_earlier_rows_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "lm_corpus", lambda work, mb: tmp_path / "corpus.txt")
    monkeypatch.setattr(data, "row", lambda kind, size, corpus, work, before:
                        {"corpus": kind, "size": size, "encode": {"seconds": 1.0}})
    out = tmp_path / "bench-data.json"
    earlier = {"corpus": "pairs", "size": "30k", "encode": {"seconds": 2.0}}
    out.write_text(json.dumps([earlier, {"corpus": "lm", "size": "10MB"}]))
    data.main(["--sizes", "lm:10MB", "--work", str(tmp_path / "work"), "--json", str(out)])
    kept, new = json.loads(out.read_text())
    assert kept == earlier  # another size: left as it was
    assert (new["corpus"], new["size"]) == ("lm", "10MB")
    assert new["machine"]["cores"] > 0 and new["machine"]["cpu_capability"]
    assert len(new["date"]) == 10 and new["date"][4] == "-"
