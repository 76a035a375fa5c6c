"""SQuAD v1.1: sliding-window features and answer post-processing (n-best 20, max answer 30).

Both follow the transformers question-answering example (`run_qa.py`, `utils_qa.py`), which is the
standard recipe but lives in the examples folder, not in the installable library: so it is written
out here, kept to the v1.1 case (every question has an answer).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from adaptune.data.batching import column_values

N_BEST = 20
MAX_ANSWER_LENGTH = 30
MAX_LENGTH = 384
DOC_STRIDE = 128


def window_problem(max_length: int, doc_stride: int) -> bool:
    """Whether a window of `max_length` tokens cannot hold a question plus a stride of context."""
    return doc_stride >= max_length // 2


def check_window(max_length: int, doc_stride: int) -> None:
    """Fail early (with the fix) when the window cannot hold a question plus a stride of context."""
    if window_problem(max_length, doc_stride):
        raise ValueError(
            f"SQuAD windows need doc_stride well below max_length, got max_length={max_length}, "
            f"doc_stride={doc_stride}: use the paper's max_length={MAX_LENGTH}, doc_stride={DOC_STRIDE} "
            "(or e.g. max_length=192, doc_stride=64 for small CPU runs)"
        )


def prepare_features(
    examples: Mapping[str, Sequence[Any]],
    tokenizer: Any,
    max_length: int = MAX_LENGTH,
    doc_stride: int = DOC_STRIDE,
    for_evaluation: bool = False,
) -> dict[str, list[Any]]:
    """Tokenize a batch of SQuAD examples into overlapping windows over each context.

    Every feature gets `start_positions` / `end_positions` (token indices of the gold answer, or
    0 = [CLS] when the answer is not wholly inside that window). With `for_evaluation`, features also
    keep `example_id` and an `offset_mapping` whose non-context entries are None, which
    `postprocess_predictions` needs to map logits back to text. Use with `Dataset.map(batched=True)`.
    """
    check_window(max_length, doc_stride)
    if tokenizer.padding_side != "right":
        raise ValueError("SQuAD features assume a right-padding tokenizer (question first, then context)")
    encoded = _windows(examples, tokenizer, max_length, doc_stride)
    example_of_feature = encoded.pop("overflow_to_sample_mapping")
    offsets_of_feature = encoded.pop("offset_mapping")
    starts: list[int] = []
    ends: list[int] = []
    example_ids: list[str] = []
    eval_offsets: list[list[tuple[int, int] | None]] = []
    for feature_index, offsets in enumerate(offsets_of_feature):
        example_index = example_of_feature[feature_index]
        sequence_ids = encoded.sequence_ids(feature_index)
        start, end = _answer_token_span(examples["answers"][example_index], offsets, sequence_ids)
        starts.append(start)
        ends.append(end)
        if for_evaluation:
            example_ids.append(examples["id"][example_index])
            eval_offsets.append([offset if sequence_ids[k] == 1 else None for k, offset in enumerate(offsets)])
    features: dict[str, list[Any]] = dict(encoded)
    features["start_positions"] = starts
    features["end_positions"] = ends
    if for_evaluation:
        features["example_id"] = example_ids
        features["offset_mapping"] = eval_offsets
    return features


def _windows(examples: Mapping[str, Sequence[Any]], tokenizer: Any, max_length: int, doc_stride: int) -> Any:
    """The tokenizer's overlapping windows of (question, context): offsets and the example of each window kept."""
    # Leading spaces in questions waste window room and break some tokenizers' truncation.
    questions = [question.lstrip() for question in examples["question"]]
    return tokenizer(
        questions,
        list(examples["context"]),
        truncation="only_second",
        max_length=max_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding=False,
    )


def _answer_token_span(
    answers: Mapping[str, Sequence[Any]], offsets: Sequence[tuple[int, int]], sequence_ids: Sequence[int | None]
) -> tuple[int, int]:
    """Token indices of the first gold answer inside this window, or (0, 0) when it is not wholly in it."""
    if not answers["answer_start"]:
        return 0, 0
    start_char = int(answers["answer_start"][0])
    end_char = start_char + len(answers["text"][0])
    context_tokens = [k for k, sequence_id in enumerate(sequence_ids) if sequence_id == 1]
    first, last = context_tokens[0], context_tokens[-1]
    if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
        return 0, 0
    start_token = first
    while start_token <= last and offsets[start_token][0] <= start_char:
        start_token += 1
    end_token = last
    while end_token >= first and offsets[end_token][1] >= end_char:
        end_token -= 1
    return start_token - 1, end_token + 1


def postprocess_predictions(
    examples: Mapping[str, Sequence[Any]],
    features: Mapping[str, Sequence[Any]],
    start_logits: Sequence[np.ndarray] | np.ndarray,
    end_logits: Sequence[np.ndarray] | np.ndarray,
    n_best: int = N_BEST,
    max_answer_length: int = MAX_ANSWER_LENGTH,
) -> dict[str, str]:
    """The best-scoring legal answer text per example id, over all of that example's windows.

    `examples` and `features` are column mappings (a `datasets.Dataset` or a dict of lists):
    examples need `id` and `context`, features (from `prepare_features(for_evaluation=True)`)
    `example_id` and `offset_mapping`. `start_logits[i]` / `end_logits[i]` belong to feature i;
    padding beyond its length is ignored. A candidate span must lie inside the context, end at or
    after its start and be at most `max_answer_length` tokens; among the `n_best` top starts x
    `n_best` top ends of every window, the highest start + end logit wins (v1.1: always an answer).
    """
    example_ids = column_values(features, "example_id")
    offset_maps = column_values(features, "offset_mapping")
    if len(example_ids) != len(start_logits) or len(example_ids) != len(end_logits):
        raise ValueError(f"{len(example_ids)} features but {len(start_logits)} start / {len(end_logits)} end logit rows")
    features_of_example: dict[str, list[int]] = collections.defaultdict(list)
    for feature_index, example_id in enumerate(example_ids):
        features_of_example[example_id].append(feature_index)

    predictions: dict[str, str] = {}
    for example_id, context in zip(column_values(examples, "id"), column_values(examples, "context"), strict=True):
        best_score, best_text = -np.inf, ""
        for feature_index in features_of_example.get(example_id, []):
            offsets = offset_maps[feature_index]
            starts = np.asarray(start_logits[feature_index], dtype=np.float32)[: len(offsets)]
            ends = np.asarray(end_logits[feature_index], dtype=np.float32)[: len(offsets)]
            top_ends = np.argsort(ends)[::-1][:n_best]
            for start in np.argsort(starts)[::-1][:n_best]:
                if offsets[start] is None:
                    continue
                for end in top_ends:
                    if offsets[end] is None or end < start or end - start + 1 > max_answer_length:
                        continue
                    score = float(starts[start] + ends[end])
                    if score > best_score:
                        best_score, best_text = score, context[offsets[start][0] : offsets[end][1]]
        predictions[example_id] = best_text
    return predictions
