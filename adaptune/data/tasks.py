"""The task registry: every task of the paper declared once, as data.

Like seqio's GLUE tables, tasks are rows of a table turned into `Task` records in one loop; nothing
registers itself on import elsewhere. Look tasks up with `get_task(name)`.

Splits: GLUE's test labels are not public, so its dev set is the reported (held-out) score: the
source files are "train" (train.tsv) and "dev" (dev.tsv); `data.py` makes train = train.tsv less a
seeded, stratified validation slice that every selection uses, and test = dev.tsv. The 17
additional tasks are one file each, split 80/10/10 by `data.py` (sizes equal the paper's Table 3 when
the raw rows match). SQuAD v1.1: train / validation = dev.

Hub revisions: `hub_revision` is None everywhere because the hub could not be reached when this
table was written; pin a commit hash here when online (load_dataset then uses it).
"""

from __future__ import annotations

import dataclasses
import difflib

from adaptune.core.errors import UserError

GLUE_HUB_ID = "nyu-mll/glue"
CROWDFLOWER_URL = "https://data.world/crowdflower"  # the "Data for Everyone" library, formerly crowdflower.com


class UnknownTaskError(UserError, ValueError):
    """A task name that is not in the registry."""


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a task's rows come from: a local mirror in the publisher's layout, else the hub.

    `files` maps a source file's role -> path relative to the data dir: GLUE "train" and "dev"
    (adaptune.data.splits.GLUE_SPLIT_SOURCES says which canonical split comes from which), SQuAD "train" and
    "validation", the extras one file "all", split 80/10/10 after loading.
    """

    files: tuple[tuple[str, str], ...]
    reader: str  # a reader name in adaptune.data.readers.READERS
    text_columns: tuple[str, ...]  # publisher column(s) for text_a (and text_b)
    label_column: str | None
    hub_id: str | None = None
    hub_config: str | None = None
    hub_revision: str | None = None
    hub_splits: tuple[tuple[str, str], ...] = ()  # source file role -> hub split
    hub_text_columns: tuple[str, ...] = ()
    hub_label_column: str | None = None
    url: str | None = None  # the publisher's download page, where there is no hub copy
    verified: bool = True  # False: file name / columns declared from documentation, not checked on a copy

    @property
    def file_map(self) -> dict[str, str]:
        return dict(self.files)

    @property
    def hub_split_map(self) -> dict[str, str]:
        return dict(self.hub_splits)

    def describe(self) -> str:
        hub = f"hub {self.hub_id}" + (f"/{self.hub_config}" if self.hub_config else "") if self.hub_id else None
        hub_or_url = hub or (f"publisher {self.url}" if self.url else "no hub copy")
        return f"{hub_or_url}; mirror {', '.join(sorted(set(p for _, p in self.files)))} ({self.reader})"


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    family: str  # "glue" | "extra" | "squad"
    kind: str  # "classification" | "regression" | "span"
    labels: tuple[str, ...]  # label names in index order; empty for regression/span (and see num_classes)
    metrics: tuple[str, ...]  # the first one selects the best epoch
    source: Source
    title: str = ""  # the paper's name for the task
    in_glue_score: bool = False
    # Raw label value -> label name (e.g. GLUE's "0"/"1" files, global warming's Y/Yes).
    label_aliases: tuple[tuple[str, str], ...] = ()
    # Raw label values whose rows are dropped (documented filters, e.g. disasters' "Can't Decide").
    drop_labels: tuple[str, ...] = ()
    num_classes: int | None = None  # paper's class count; checks the label set read from data when `labels` is empty
    paper_sizes: tuple[int, int, int] | None = None  # Table 3: train / validation / test
    paper_epochs: tuple[int, int] | None = None  # Table 4: (fine-tune, adapters)
    # Not trained on its own: scored by the runs of this task on its own validation split (MNLI-mm
    # is the MNLI run scored on the mismatched dev set, as in the paper: one training, two columns).
    trained_as: str | None = None

    @property
    def text_fields(self) -> tuple[str, ...]:
        return ("text_a", "text_b") if len(self.source.text_columns) == 2 else ("text_a",)

    @property
    def is_pair(self) -> bool:
        return len(self.source.text_columns) == 2

    @property
    def num_labels(self) -> int:
        """Output size of the classifier head: 1 for regression, the class count otherwise."""
        if self.kind == "regression":
            return 1
        if self.kind == "span":
            return 2
        return len(self.labels) or int(self.num_classes or 0)

    @property
    def primary_metric(self) -> str:
        return self.metrics[0]

    @property
    def alias_map(self) -> dict[str, str]:
        return dict(self.label_aliases)


# ---------------------------------------------------------------------------------------------------
# GLUE (Table 1). name: (mirror dir, hub config, kind, labels, metrics, local text cols, hub text cols,
# label column, reader, aliases for the files' raw labels)
_BINARY = {"0": 0, "1": 1}

_GLUE_TABLE: dict[str, dict] = {
    # CoLA selects by MCC (Table 1); accuracy is kept too: Section 3.6 and Figure 6 report validation accuracy.
    "cola": dict(dir="CoLA", config="cola", labels=("unacceptable", "acceptable"), metrics=("matthews_correlation", "accuracy"),
                 text=("sentence",), hub_text=("sentence",), reader="glue_cola_tsv", binary=True),
    "sst2": dict(dir="SST-2", config="sst2", labels=("negative", "positive"), metrics=("accuracy",),
                 text=("sentence",), hub_text=("sentence",), reader="tsv", binary=True),
    "mrpc": dict(dir="MRPC", config="mrpc", labels=("not_equivalent", "equivalent"), metrics=("f1", "accuracy"),
                 text=("#1 String", "#2 String"), hub_text=("sentence1", "sentence2"), label_column="Quality",
                 reader="tsv", binary=True),
    "stsb": dict(dir="STS-B", config="stsb", labels=(), kind="regression", metrics=("spearman", "pearson"),
                 text=("sentence1", "sentence2"), hub_text=("sentence1", "sentence2"), label_column="score", reader="tsv"),
    "qqp": dict(dir="QQP", config="qqp", labels=("not_duplicate", "duplicate"), metrics=("f1", "accuracy"),
                text=("question1", "question2"), hub_text=("question1", "question2"), label_column="is_duplicate",
                reader="tsv", binary=True),
    "mnli_m": dict(dir="MNLI", config="mnli", labels=("entailment", "neutral", "contradiction"), metrics=("accuracy",),
                   text=("sentence1", "sentence2"), hub_text=("premise", "hypothesis"), label_column="gold_label",
                   reader="tsv", dev="dev_matched.tsv", hub_dev="validation_matched"),
    "mnli_mm": dict(dir="MNLI", config="mnli", labels=("entailment", "neutral", "contradiction"), metrics=("accuracy",),
                    text=("sentence1", "sentence2"), hub_text=("premise", "hypothesis"), label_column="gold_label",
                    reader="tsv", dev="dev_mismatched.tsv", hub_dev="validation_mismatched", trained_as="mnli_m"),
    "qnli": dict(dir="QNLI", config="qnli", labels=("entailment", "not_entailment"), metrics=("accuracy",),
                 text=("question", "sentence"), hub_text=("question", "sentence"), reader="tsv"),
    "rte": dict(dir="RTE", config="rte", labels=("entailment", "not_entailment"), metrics=("accuracy",),
                text=("sentence1", "sentence2"), hub_text=("sentence1", "sentence2"), reader="tsv"),
    # WNLI is declared but excluded from the GLUE score, as in the paper. Its files say 1 = entailment.
    "wnli": dict(dir="WNLI", config="wnli", labels=("not_entailment", "entailment"), metrics=("accuracy",),
                 text=("sentence1", "sentence2"), hub_text=("sentence1", "sentence2"), reader="tsv", binary=True,
                 in_glue_score=False),
}

# The GLUE folders whose files were read here (shared/data's README); the others' file names and columns are
# declared from GLUE's documentation (their hub copies are the checked source).
GLUE_FILES_READ = ("CoLA", "SST-2", "MRPC", "RTE", "QNLI")

_GLUE_TITLES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP", "mnli_m": "MNLI-m",
                "mnli_mm": "MNLI-mm", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}


def _glue_task(name: str, row: dict) -> Task:
    labels = row["labels"]
    dev = row.get("dev", "dev.tsv")
    source = Source(
        files=(("train", f"glue/{row['dir']}/train.tsv"), ("dev", f"glue/{row['dir']}/{dev}")),
        reader=row["reader"],
        text_columns=row["text"],
        label_column=row.get("label_column", "label"),
        hub_id=GLUE_HUB_ID,
        hub_config=row["config"],
        hub_splits=(("train", "train"), ("dev", row.get("hub_dev", "validation"))),
        hub_text_columns=row["hub_text"],
        hub_label_column="label",
        verified=row["dir"] in GLUE_FILES_READ,
    )
    # The GLUE files write binary labels as 0/1; the hub names them. Map both onto the names.
    aliases = tuple((str(i), label) for i, label in enumerate(labels)) if row.get("binary") else ()
    return Task(
        name=name, family="glue", kind=row.get("kind", "classification"), labels=labels, metrics=row["metrics"],
        source=source, title=_GLUE_TITLES[name], in_glue_score=row.get("in_glue_score", True), label_aliases=aliases,
        trained_as=row.get("trained_as"),
    )


# ---------------------------------------------------------------------------------------------------
# The 17 additional tasks (Tables 2-4). Sizes = Table 3 (train, validation, test); epochs = Table 4
# (fine-tune, adapters). Sources marked verified=False are declared from the publishers' documentation:
# no copy was at hand to check the file name and columns.
_EXTRA_TABLE: dict[str, dict] = {
    "newsgroups_20": dict(
        title="20 newsgroups", sizes=(15076, 1885, 1885), epochs=(50, 50), num_classes=20,
        file="extra/20_newsgroups/20news-bydate.tar.gz", reader="newsgroups_tar", text=("text",), label="group",
        labels=("alt.atheism", "comp.graphics", "comp.os.ms-windows.misc", "comp.sys.ibm.pc.hardware",
                "comp.sys.mac.hardware", "comp.windows.x", "misc.forsale", "rec.autos", "rec.motorcycles",
                "rec.sport.baseball", "rec.sport.hockey", "sci.crypt", "sci.electronics", "sci.med", "sci.space",
                "soc.religion.christian", "talk.politics.guns", "talk.politics.mideast", "talk.politics.misc",
                "talk.religion.misc"),
        url="http://qwone.com/~jason/20Newsgroups/20news-bydate.tar.gz"),
    "airline": dict(
        title="Crowdflower airline", sizes=(11712, 1464, 1464), epochs=(50, 20),
        file="extra/airline/Airline-Sentiment-2-w-AA.csv", reader="csv", text=("text",), label="airline_sentiment",
        labels=("negative", "neutral", "positive"), url=f"{CROWDFLOWER_URL}/airline-twitter-sentiment"),
    "corporate_messaging": dict(
        title="Crowdflower corporate messaging", sizes=(2494, 312, 312), epochs=(100, 50),
        file="extra/corporate_messaging/Corporate-messaging-DFE.csv", reader="csv", text=("text",), label="category",
        labels=("Action", "Dialogue", "Exclude", "Information"), url=f"{CROWDFLOWER_URL}/corporate-messaging",
        verified=False),
    "disasters": dict(
        title="Crowdflower disasters", sizes=(8688, 1086, 1086), epochs=(50, 50),
        file="extra/disasters/socialmedia-disaster-tweets-DFE.csv", reader="csv", text=("text",), label="choose_one",
        labels=("Not Relevant", "Relevant"), drop=("Can't Decide",), url=f"{CROWDFLOWER_URL}/disasters-on-social-media"),
    "economic_news": dict(
        title="Crowdflower economic news relevance", sizes=(6392, 799, 800), epochs=(20, 20),
        file="extra/economic_news/Full-Economic-News-DFE-839861.csv", reader="csv", text=("text",), label="relevance",
        labels=("no", "yes"), drop=("not sure",), url=f"{CROWDFLOWER_URL}/economic-news-article-tone-and-relevance",
        verified=False),
    "emotion": dict(
        title="Crowdflower emotion", sizes=(32000, 4000, 4000), epochs=(20, 20),
        file="extra/emotion/text_emotion.csv", reader="csv", text=("content",), label="sentiment",
        labels=("anger", "boredom", "empty", "enthusiasm", "fun", "happiness", "hate", "love", "neutral", "relief",
                "sadness", "surprise", "worry"),
        url=f"{CROWDFLOWER_URL}/sentiment-analysis-in-text"),
    "global_warming": dict(
        title="Crowdflower global warming", sizes=(3380, 422, 423), epochs=(100, 50),
        file="extra/global_warming/1377884570_tweet_global_warming.csv", reader="csv", text=("tweet",),
        label="existence", labels=("no", "yes"), aliases=(("Y", "yes"), ("Yes", "yes"), ("N", "no"), ("No", "no")),
        drop=("", "NA", "N/A"), url=f"{CROWDFLOWER_URL}/sentiment-of-climate-change"),
    # The publisher's full file (Political-media-DFE.csv: Mac OS Roman, bare-CR line ends) holds all three labels.
    # political_bias/political_social_media.csv (bias and text only) is the same 5000 posts in the same order, with
    # the same bias labels (tests/test_tasks.py checks it): nothing reads it any more.
    "political_audience": dict(
        title="Crowdflower political audience", sizes=(4000, 500, 500), epochs=(50, 20),
        file="extra/political_media/Political-media-DFE.csv", reader="csv_mac_roman", text=("text",), label="audience",
        labels=("constituency", "national"), url=f"{CROWDFLOWER_URL}/political-social-media-posts"),
    "political_bias": dict(
        title="Crowdflower political bias", sizes=(4000, 500, 500), epochs=(50, 50),
        file="extra/political_media/Political-media-DFE.csv", reader="csv_mac_roman", text=("text",), label="bias",
        labels=("neutral", "partisan"), url=f"{CROWDFLOWER_URL}/political-social-media-posts"),
    "political_message": dict(
        title="Crowdflower political message", sizes=(4000, 500, 500), epochs=(50, 50),
        file="extra/political_media/Political-media-DFE.csv", reader="csv_mac_roman", text=("text",), label="message",
        labels=("attack", "constituency", "information", "media", "mobilization", "other", "personal", "policy",
                "support"),
        url=f"{CROWDFLOWER_URL}/political-social-media-posts"),
    "primary_emotions": dict(
        title="Crowdflower primary emotions", sizes=(2019, 252, 253), epochs=(100, 100), num_classes=18,
        file="extra/primary_emotions/primary-plutchik-wheel-DFE.csv", reader="csv", text=("sentence",),
        label="emotion", url=f"{CROWDFLOWER_URL}/primary-emotions-of-statements", verified=False),
    # One file, two tasks: the answers to the annotators' questions 1 (stance towards the tweet's target, one of
    # 4 topics in `target`) and 2 (whose opinion the tweet expresses). The answers are the questions' full option
    # sentences: aliased to short names (index order: the options' order).
    "progressive_opinion": dict(
        title="Crowdflower progressive opinion", sizes=(927, 116, 116), epochs=(100, 100),
        file="extra/progressive/progressive-tweet-sentiment.csv", reader="csv", text=("tweet",),
        label="q2_which_of_the_options_below_is_true_about_the_opinion_in_the_tweet",
        labels=("about_target", "about_other", "no_opinion"),
        aliases=(
            ("1.  The tweet explicitly expresses opinion about the target, a part of the target, or an aspect of the "
             "target.", "about_target"),
            ("2. The tweet does NOT expresses opinion about the target but it HAS opinion about something or someone "
             "other than the target.", "about_other"),
            ("3.  The tweet is not explicitly expressing opinion. (For example, the tweet is simply giving "
             "information.)", "no_opinion"),
        ),
        url=f"{CROWDFLOWER_URL}/progressive-issues-sentiment-analysis"),
    "progressive_stance": dict(
        title="Crowdflower progressive stance", sizes=(927, 116, 116), epochs=(100, 100),
        file="extra/progressive/progressive-tweet-sentiment.csv", reader="csv", text=("tweet",),
        label="q1_from_reading_the_tweet_which_of_the_options_below_is_most_likely_to_be_true_about_the_stance_or_"
              "outlook_of_the_tweeter_towards_the_target",
        labels=("against", "for", "neutral", "none"),
        aliases=(
            ("AGAINST: We can infer from the tweet that the tweeter is against the target (e.g., directly or indirectly "
             "by opposing or criticizing someone/something, by supporting someone/something opposed to the target, or "
             "by echoing the stance of somebody else).", "against"),
            ("FOR: We can infer from the tweet that the tweeter supports the target (e.g., directly or indirectly by "
             "supporting someone/something, by opposing or criticizing someone/something opposed to the target, or by "
             "echoing the stance of somebody else).", "for"),
            ("NEUTRAL: We can infer from the tweet that the tweeter has a neutral stance towards the target. (The tweet "
             "being neither favorable nor against the target is not sufficient reason for choosing this option. One "
             "reason for choosing this option is that the tweeter supports the target entity to some extent, but is "
             "also against it to some extent.)", "neutral"),
            ("NONE OF THE ABOVE: There is no clue in the tweet to reveal the stance of the tweeter towards the target "
             "(support/against/neutral).", "none"),
        ),
        url=f"{CROWDFLOWER_URL}/progressive-issues-sentiment-analysis"),
    "us_economic_performance": dict(
        title="Crowdflower US economic performance", sizes=(3961, 495, 496), epochs=(100, 20), num_classes=2,
        file="extra/us_economic_performance/US-Economic-News.csv", reader="csv", text=("text",), label="relevance",
        url=f"{CROWDFLOWER_URL}/us-economic-news-articles", verified=False),
    "customer_complaints": dict(
        title="Customer complaint database", sizes=(146667, 18333, 18334), epochs=(20, 20), num_classes=157,
        file="extra/customer_complaints/Consumer_Complaints.csv", reader="csv",
        text=("Consumer complaint narrative",), label="Issue", drop=("",),
        url="https://catalog.data.gov/dataset/consumer-complaint-database", verified=False),
    "news_aggregator": dict(
        title="News aggregator dataset", sizes=(338349, 42294, 42294), epochs=(20, 20),
        file="extra/news_aggregator/newsCorpora.csv", reader="news_aggregator_tsv", text=("TITLE",), label="CATEGORY",
        labels=("b", "e", "m", "t"), url="https://archive.ics.uci.edu/dataset/359/news+aggregator", verified=False),
    "sms_spam": dict(
        title="SMS spam collection", sizes=(4459, 557, 558), epochs=(50, 20),
        file="extra/sms_spam/SMSSpamCollection", reader="sms_spam_tsv", text=("text",), label="label",
        labels=("ham", "spam"), hub_id="ucirvine/sms_spam", hub_config="plain_text", hub_text=("sms",),
        url="https://archive.ics.uci.edu/dataset/228/sms+spam+collection"),
}


def _extra_task(name: str, row: dict) -> Task:
    labels = row.get("labels", ())
    source = Source(
        files=(("all", row["file"]),), reader=row["reader"], text_columns=row["text"], label_column=row["label"],
        hub_id=row.get("hub_id"), hub_config=row.get("hub_config"),
        hub_splits=(("all", "train"),) if row.get("hub_id") else (),
        hub_text_columns=row.get("hub_text", ()), hub_label_column="label" if row.get("hub_id") else None,
        url=row.get("url"), verified=row.get("verified", True),
    )
    return Task(
        name=name, family="extra", kind="classification", labels=labels, metrics=("accuracy",), source=source,
        title=row["title"], label_aliases=row.get("aliases", ()), drop_labels=row.get("drop", ()),
        num_classes=row.get("num_classes", len(labels)), paper_sizes=row["sizes"], paper_epochs=row["epochs"],
    )


_SQUAD = Task(
    name="squad", family="squad", kind="span", labels=(), metrics=("f1", "exact_match"), title="SQuAD v1.1",
    source=Source(
        files=(("train", "squad/train-v1.1.json"), ("validation", "squad/dev-v1.1.json")), reader="squad_json",
        text_columns=("question", "context"), label_column=None, hub_id="rajpurkar/squad", hub_config="plain_text",
        hub_splits=(("train", "train"), ("validation", "validation")),
        url="https://rajpurkar.github.io/SQuAD-explorer/",
    ),
)


def _build_registry() -> dict[str, Task]:
    tasks = {name: _glue_task(name, row) for name, row in _GLUE_TABLE.items()}
    tasks.update({name: _extra_task(name, row) for name, row in _EXTRA_TABLE.items()})
    tasks[_SQUAD.name] = _SQUAD
    return tasks


TASKS: dict[str, Task] = _build_registry()
GLUE_TASKS: tuple[str, ...] = tuple(_GLUE_TABLE)  # wnli included; see Task.in_glue_score
GLUE_SCORE_TASKS: tuple[str, ...] = tuple(n for n in GLUE_TASKS if TASKS[n].in_glue_score)
EXTRA_TASKS: tuple[str, ...] = tuple(_EXTRA_TABLE)


# The split schemes a run's data can follow (a run record's data_split).
STANDARD_SPLIT = "standard"  # the task's own splits (the paper's)
SQUAD_STANDIN = "squad_dev_standin"  # SQuAD from dev-v1.1 alone: train / validation = disjoint dev articles
DATA_SPLITS = (STANDARD_SPLIT, SQUAD_STANDIN)

# The split scheme each family's data follows (adaptune.data.loading). A run record carries its task's scheme,
# and the run store never reuses a record made under another one (adaptune.sweep.shard_runner: "stale"). Bump a
# family's entry in the commit that changes how its splits are cut.
DATA_SCHEMES = {
    "glue": "glue-2",  # validation: 10% of train.tsv held out (stratified, seed 0); test: dev.tsv (glue-1: dev was validation)
    "extra": "extra-1",  # one file split 80/10/10, seeded
    "squad": "squad-1",  # train-v1.1 / dev-v1.1, else the named squad_dev_standin articles
}


def data_scheme(task: str | Task) -> str:
    """The split scheme of the task's family (DATA_SCHEMES), as run records carry it."""
    return DATA_SCHEMES[get_task(task).family]


def get_task(name: str | Task) -> Task:
    """The registered task of this name (case-insensitive, '-' accepted for '_')."""
    if isinstance(name, Task):
        return name
    key = str(name).strip().lower().replace("-", "_")
    if key in TASKS:
        return TASKS[key]
    close = difflib.get_close_matches(key, list(TASKS), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise UnknownTaskError(f"unknown task {name!r}: {hint}known tasks: {', '.join(TASKS)}")


def scored_companions(name: str) -> tuple[str, ...]:
    """Tasks whose scores come from this task's runs (Task.trained_as): ("mnli_mm",) for mnli_m."""
    return tuple(task.name for task in TASKS.values() if task.trained_as == name)
