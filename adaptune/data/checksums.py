"""The publishers' files the project has read, by their path in a data mirror, with their md5.

A file of one of these names whose bytes differ is not the copy the task definitions were checked
against (another release, a re-export, a truncated download): the data-preparation step and
`stage-data` say so before anything trains on it. md5, not sha256, because it is what Cloud Storage
keeps for every object (its md5Hash) and what the publishers' mirrors list.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

KNOWN_MD5: dict[str, str] = {
    "glue/CoLA/train.tsv": "0017f72718b43d880cd9050d8107f811",
    "glue/CoLA/dev.tsv": "66fdcac072ac7f60b645542b51fa7cd1",
    "glue/SST-2/train.tsv": "da409a0a939379ed32a470bc0f7fe99a",
    "glue/SST-2/dev.tsv": "268856b487b2a31a28c0a93daaff7288",
    "glue/MRPC/train.tsv": "ce85e419c7df081267c9e01415f86fd7",
    "glue/MRPC/dev.tsv": "cbf6fb5d759c11c9cda50c7c876a3c81",
    "glue/RTE/train.tsv": "791051bd1bdc71a74ad2d674d5c256ca",
    "glue/RTE/dev.tsv": "973cb4178d4534cf745a01c309d4a66c",
    "glue/QNLI/dev.tsv": "3f9bee4d3ed4554cea548df75bd94ec7",
    "squad/dev-v1.1.json": "3e85deb501d4e538b6bc56f786231552",
    "extra/sms_spam/SMSSpamCollection": "1949b64a224790d01335c2bf8a0e48b2",
    "extra/airline/Airline-Sentiment-2-w-AA.csv": "fb9b0618037d48b6ab934a62d2530eee",
    "extra/disasters/socialmedia-disaster-tweets-DFE.csv": "09b2f6aededfe6079c4d70b06783c93f",
    "extra/emotion/text_emotion.csv": "1a88c8d6c7cc028dd65230825bb26381",
    "extra/global_warming/1377884570_tweet_global_warming.csv": "1058d6435b2156e3152474fb81cec7c0",
    "extra/political_bias/political_social_media.csv": "bec98b3a6350d956b521fef386595664",
    "extra/20_newsgroups/20news-bydate.tar.gz": "0c618efd600a3c4bd2e6c733f563e05b",
    "extra/political_media/Political-media-DFE.csv": "cc4cbf87ec3c49bf6b2127a8ae23508d",
    "extra/progressive/progressive-tweet-sentiment.csv": "36b9d05ea37da0d53e391615166fa554",
}


def file_md5(path: str | Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "md5").hexdigest()


def checksum_problem(path: str | Path, relative: str) -> str | None:
    """None where `path` (the mirror's `relative`) is the known copy or no checksum is known; else one line saying so."""
    expected = KNOWN_MD5.get(relative)
    if expected is None:
        return None
    actual = file_md5(path)
    if actual != expected:
        return f"{path}: md5 {actual}, not the {expected} of the copy the project checked: download the publisher's file again"
    return None


def md5_problem(where: str | Path, relative: str, actual: str) -> str | None:
    """checksum_problem for an md5 already computed (`actual`, of the file at `where`): a file hashed once
    is compared with KNOWN_MD5 and with a staged copy (adaptune.sweep.data_staging) without reading it again."""
    expected = KNOWN_MD5.get(relative)
    if expected is None or actual == expected:
        return None
    return f"{where}: md5 {actual}, not the {expected} of the copy the project checked: download the publisher's file again"
