import pytest

from vaswani.data.files import (
    DataError,
    ReadReport,
    iter_classification,
    iter_translation,
    read_text,
)


def read_translation(paths, report):
    return list(iter_translation(paths, report))


def read_classification(paths, fmt, report):
    return list(iter_classification(paths, fmt, report))


def write(tmp_path, name, content: bytes | str):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def test_translation_tsv_and_blank_lines_counted(tmp_path):
    path = write(tmp_path, "t.tsv", "hello\thola\n\nbye\tadiós\n")
    report = ReadReport()
    assert read_translation([path], report) == [("hello", "hola"), ("bye", "adiós")]
    assert report.blank_lines == 1 and "ignored 1 blank line" in report.summary()


def test_wrong_column_count_names_file_and_line(tmp_path):
    path = write(tmp_path, "t.tsv", "a\tb\nonly one column\nc\td\n")
    with pytest.raises(DataError, match=r"t.tsv:2: expected 2 tab-separated columns .* found 1"):
        read_translation([path], ReadReport())


def test_max_skip_counts_and_reports_bad_lines(tmp_path):
    path = write(tmp_path, "t.tsv", "a\tb\nbad\nc\td\ne\tf\tg\n")
    report = ReadReport(max_skip=2)
    assert len(read_translation([path], report)) == 2
    assert len(report.skipped) == 2 and "skipped 2 bad line(s)" in report.summary()
    with pytest.raises(DataError, match=r"t.tsv:4: .*already skipped 1"):
        read_translation([path], ReadReport(max_skip=1))


def test_invalid_utf8_names_line_and_byte(tmp_path):
    path = write(tmp_path, "t.tsv", b"a\tb\nca\xe9\tcafe\n")
    with pytest.raises(DataError, match=r"t.tsv:2: invalid UTF-8 \(byte 0xe9 at column 3\)"):
        read_translation([path], ReadReport())


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(DataError, match="file is empty"):
        read_translation([write(tmp_path, "e.tsv", "\n\n")], ReadReport())
    with pytest.raises(FileNotFoundError, match="data file not found"):
        read_translation([str(tmp_path / "nope.tsv")], ReadReport())
    with pytest.raises(FileNotFoundError, match="no file matches"):
        read_text([str(tmp_path / "*.txt")], ReadReport())


def test_empty_target_is_a_bad_line(tmp_path):
    with pytest.raises(DataError, match=r"t.tsv:1: empty target"):
        read_translation([write(tmp_path, "t.tsv", "hello\t \n")], ReadReport())


def test_two_aligned_files(tmp_path):
    src = write(tmp_path, "a.en", "one\ntwo\n")
    tgt = write(tmp_path, "a.es", "uno\ndos\n")
    assert read_translation([src, tgt], ReadReport()) == [("one", "uno"), ("two", "dos")]
    short = write(tmp_path, "b.es", "uno\n")
    with pytest.raises(DataError, match=r"a.en has 2 lines but .*b.es has 1"):
        read_translation([src, short], ReadReport())


def test_language_model_text_from_a_glob(tmp_path):
    write(tmp_path, "1.txt", "first\nfile")
    write(tmp_path, "2.txt", "second")
    assert read_text([str(tmp_path / "*.txt")], ReadReport()) == "first\nfile\nsecond"


def test_classification_tsv_csv_jsonl(tmp_path):
    tsv = write(tmp_path, "c.tsv", "label\ttext\nspam\tbuy now\nham\thi mum\n")
    csv = write(tmp_path, "c.csv", 'text,label\n"hello, world",ham\nwin money,spam\n')
    jsonl = write(tmp_path, "c.jsonl", '{"label": "ham", "text": "see you"}\n')
    assert read_classification([tsv], "auto", ReadReport()) == [("spam", "buy now"),
                                                                ("ham", "hi mum")]
    assert read_classification([csv], "auto", ReadReport()) == [("ham", "hello, world"),
                                                                ("spam", "win money")]
    assert read_classification([jsonl], "auto", ReadReport()) == [("ham", "see you")]


@pytest.mark.parametrize("name, content, message", [
    ("c.jsonl", '{"label": "a", "text": "x"}\n{"text": "no label"}\n', r"c.jsonl:2: label missing"),
    ("c.jsonl", '{"label": "a", "text": "x"}\n{oops\n', r"c.jsonl:2: invalid JSON"),
    ("c.tsv", "a\tx\n\ty\n", r"c.tsv:2: label missing"),
    ("c.csv", "label,body\na,x\n", r"c.csv:1: CSV header .* lacks column\(s\) \['text'\]"),
    ("c.csv", "label,text\na,x\n,y\n", r"c.csv:3: label missing"),
])
def test_classification_errors(tmp_path, name, content, message):
    with pytest.raises(DataError, match=message):
        read_classification([write(tmp_path, name, content)], "auto", ReadReport())


@pytest.mark.parametrize("block", [1, 7, 100, 1 << 22])
def test_text_read_in_blocks_equals_the_lines_joined(tmp_path, block):
    """iter_text_pieces (blocks) gives read_text (lines joined by newlines) exactly: CRLF and
    lone CR endings, a BOM, a file without a final newline, blank lines, and a line that is not
    UTF-8 (reported with its number in both)."""
    from vaswani.data.files import iter_text_pieces

    files = [write(tmp_path, "a.txt", "first line\n\nsecond  \nlast"),
             write(tmp_path, "b.txt", "\ufeffwin\r\ndows\r\n\r\n"),
             write(tmp_path, "c.txt", "old\rmac\rend\n")]
    bad = tmp_path / "d.txt"
    bad.write_bytes(b"ok\nbad \xff\nfine\n")
    paths = [str(f) for f in files] + [str(bad)]
    lines, blocks = ReadReport(max_skip=3), ReadReport(max_skip=3)
    assert "".join(iter_text_pieces(paths, blocks, block=block)) == read_text(paths, lines)
    assert blocks.skipped == lines.skipped == [f"{bad}:2: invalid UTF-8 (byte 0xff at column 5)"]


@pytest.mark.parametrize("ending", [b"\n", b""])
def test_a_line_too_long_is_a_bad_line_read_no_further_than_the_limit(tmp_path, monkeypatch,
                                                                     ending):
    """A TSV with one enormous line (a 2 GiB one took 6.6 GB and a MemoryError): the line is
    named as too long, and with max_skip skipped without being held; the lines around it and
    their numbers are as they were."""
    from vaswani.data import files

    monkeypatch.setattr(files, "MAX_LINE", 64)
    path = tmp_path / "p.tsv"
    path.write_bytes(b"a\tb\n" + b"x" * 1000 + b"\tc\n\r\nc\td\n" + b"y" * 500 + ending)
    with pytest.raises(DataError, match=r"p.tsv:2: the line is too long \(over 0 MiB\)"):
        list(iter_translation([str(path)], ReadReport()))
    report = ReadReport(max_skip=2)
    assert list(iter_translation([str(path)], report)) == [("a", "b"), ("c", "d")]
    assert report.skipped == [f"{path}:2: the line is too long (over 0 MiB)",
                              f"{path}:5: the line is too long (over 0 MiB)"]
    assert report.blank_lines == 1
