"""Parse each publisher's raw file format into rows of {column: str}, each with its line number.

Every reader returns `list[RawRow]` and raises `MalformedFileError` naming the file and line. The
delimited readers use the standard library's `csv` module rather than pandas because it reports
the physical line of every record (quoted CSV fields span lines) and can be strict about quoting;
a row with the wrong number of fields is an error, never silently padded.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from adaptune.core.errors import UserError


class MalformedFileError(UserError, ValueError):
    """A raw data file that cannot be parsed; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class RawRow:
    line: int  # 1-based line where the record starts (or an ordinal for non-line formats)
    fields: dict[str, str]


def decode_text(raw: bytes) -> str:
    """UTF-8 (a BOM dropped) when the bytes are valid UTF-8, else latin-1.

    CrowdFlower exports differ: some copies are UTF-8, some latin-1/cp1252; latin-1 never fails, so
    it is the fallback rather than the first guess.
    """
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _delimited(path: Path, *, delimiter: str, quoting: Literal[0, 1, 2, 3], columns: tuple[str, ...] | None,
               encoding: str | None = None) -> list[RawRow]:
    """Rows of a delimited file; `columns` names a headerless file's columns, else the header does.

    `encoding` None: `decode_text`'s guess. Line ends may be \\n, \\r\\n or a bare \\r (the csv module reads
    the text with newline='' and takes any of them, inside quoted fields too).
    """
    raw = path.read_bytes()
    text = decode_text(raw) if encoding is None else raw.decode(encoding)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting, strict=True)
    rows: list[RawRow] = []
    try:
        header = list(columns) if columns else next(reader)
        start = reader.line_num + 1
        for record in reader:
            if not record:  # a blank line (a file's trailing newline): nothing to read
                start = reader.line_num + 1
                continue
            if len(record) != len(header):
                raise MalformedFileError(
                    f"{path}: line {start}: expected {len(header)} fields ({delimiter!r}-separated: {header}), "
                    f"found {len(record)}; the file may be truncated or corrupted: re-download it")
            rows.append(RawRow(start, dict(zip(header, record))))
            start = reader.line_num + 1
    except StopIteration:
        raise MalformedFileError(f"{path}: the file is empty (no header line)") from None
    except csv.Error as error:
        raise MalformedFileError(f"{path}: line {reader.line_num}: {error}; the file may be truncated: re-download it") from None
    return rows


def read_csv(path: Path) -> list[RawRow]:
    """A comma-separated file with a header line and standard quoting (the CrowdFlower exports)."""
    return _delimited(path, delimiter=",", quoting=csv.QUOTE_MINIMAL, columns=None)


def read_csv_mac_roman(path: Path) -> list[RawRow]:
    """A CrowdFlower export saved by a classic Mac program: Mac OS Roman bytes, lines ending in a bare carriage return.

    CrowdFlower's political social media file (Political-media-DFE.csv) is one. Its bytes decode as latin-1 too
    (every byte does), but as Mac OS Roman they give the text of the publisher's other copy of the same posts
    (political_social_media.csv, UTF-8) on 4999 of 5000 rows; as latin-1 on 4026 (e.g. Mac Roman "â€™" where
    latin-1 reads "\\x89Ûª").
    """
    return _delimited(path, delimiter=",", quoting=csv.QUOTE_MINIMAL, columns=None, encoding="mac_roman")


def read_tsv(path: Path) -> list[RawRow]:
    """A GLUE-style tab-separated file with a header; quotes are literal text (the GLUE files are unquoted)."""
    return _delimited(path, delimiter="\t", quoting=csv.QUOTE_NONE, columns=None)


def read_glue_cola_tsv(path: Path) -> list[RawRow]:
    """CoLA: no header; source, label, original label (blank), sentence."""
    return _delimited(path, delimiter="\t", quoting=csv.QUOTE_NONE, columns=("source", "label", "original_label", "sentence"))


def read_sms_spam_tsv(path: Path) -> list[RawRow]:
    """UCI SMS Spam Collection: no header; label<TAB>text."""
    return _delimited(path, delimiter="\t", quoting=csv.QUOTE_NONE, columns=("label", "text"))


def read_news_aggregator_tsv(path: Path) -> list[RawRow]:
    """UCI News Aggregator newsCorpora.csv: tab-separated despite its name, no header."""
    columns = ("ID", "TITLE", "URL", "PUBLISHER", "CATEGORY", "STORY", "HOSTNAME", "TIMESTAMP")
    return _delimited(path, delimiter="\t", quoting=csv.QUOTE_NONE, columns=columns)


_MESSAGE_ID = re.compile(r"^\d+$")


def read_newsgroups_tar(path: Path) -> list[RawRow]:
    """20 Newsgroups "bydate" tarball: train and test pooled (18846 documents), ordered by member path.

    Only members named by a numeric message id are documents: this skips stray files such as
    `alt.atheism/54473-o` (in the shared copy, a second copy of message 54473 beside it, differing
    only in whitespace), which leaves the 18846 documents of the bydate release. Some copies have each document's
    line breaks replaced by tabs (the train half of the shared copy); a document whose only line
    break is the final one but which contains tabs gets its line breaks back (tabs -> newlines).
    Text is decoded as latin-1, as scikit-learn's fetch_20newsgroups does.
    """
    rows: list[RawRow] = []
    try:
        with tarfile.open(path) as archive:
            members = sorted((m for m in archive if m.isfile()), key=lambda m: m.name)
            for ordinal, member in enumerate(members, start=1):
                parts = member.name.split("/")
                if len(parts) != 3 or not parts[0].startswith("20news-bydate-") or not _MESSAGE_ID.match(parts[2]):
                    continue
                handle = archive.extractfile(member)
                assert handle is not None  # a regular file's (isfile above)
                text = handle.read().decode("latin-1")
                if "\t" in text and "\n" not in text.rstrip("\n"):
                    text = text.replace("\t", "\n")
                rows.append(RawRow(ordinal, {"group": parts[1], "text": text, "id": f"{parts[1]}/{parts[2]}"}))
    except (tarfile.TarError, EOFError, OSError) as error:
        raise MalformedFileError(f"{path}: cannot read the tar archive ({error}); it may be truncated: re-download it") from None
    if not rows:
        raise MalformedFileError(f"{path}: no 20news-bydate-*/<group>/<id> documents in the archive")
    return rows


def read_squad_json(path: Path) -> list[RawRow]:
    """Official SQuAD v1.1 JSON: one row per question, with fields id, title, context, question, answers.

    `answers` is kept as JSON text here ({"text": [...], "answer_start": [...]}, the hub's layout);
    data.py turns it back into a struct column.
    """
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise MalformedFileError(f"{path}: line {error.lineno}: invalid JSON ({error.msg}); the file may be truncated") from None
    rows: list[RawRow] = []
    try:
        for article in document["data"]:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    answers = {"text": [a["text"] for a in qa["answers"]],
                               "answer_start": [int(a["answer_start"]) for a in qa["answers"]]}
                    rows.append(RawRow(len(rows) + 1, {
                        "id": qa["id"], "title": article["title"], "context": paragraph["context"],
                        "question": qa["question"], "answers": json.dumps(answers)}))
    except (KeyError, TypeError) as error:
        raise MalformedFileError(f"{path}: question {len(rows) + 1}: missing SQuAD field {error}; expected the official v1.1 layout") from None
    return rows


# The readers of files with a header line: reader name -> (delimiter, encoding; None: decode_text's guess).
_HEADED: dict[str, tuple[str, str | None]] = {"csv": (",", None), "csv_mac_roman": (",", "mac_roman"), "tsv": ("\t", None)}


def read_header(path: Path, reader: str) -> list[str] | None:
    """The column names of a headed delimited file (read from its start only), else None."""
    if reader not in _HEADED:
        return None
    delimiter, encoding = _HEADED[reader]
    with path.open("rb") as handle:
        chunk = handle.read(1 << 16)
    start = decode_text(chunk) if encoding is None else chunk.decode(encoding)
    return next(csv.reader(io.StringIO(start, newline=""), delimiter=delimiter), None)


READERS: dict[str, Callable[[Path], list[RawRow]]] = {
    "csv": read_csv,
    "csv_mac_roman": read_csv_mac_roman,
    "tsv": read_tsv,
    "glue_cola_tsv": read_glue_cola_tsv,
    "sms_spam_tsv": read_sms_spam_tsv,
    "news_aggregator_tsv": read_news_aggregator_tsv,
    "newsgroups_tar": read_newsgroups_tar,
    "squad_json": read_squad_json,
}
