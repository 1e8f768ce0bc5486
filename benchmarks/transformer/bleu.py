"""Provides uncased corpus BLEU with sacrebleu, and a re-implementation of MLPerf's t2t-style BLEU.

MLPerf's translation benchmark (v0.5 to v0.7, TensorFlow reference) scores with tensor2tensor's
`bleu_hook.bleu_wrapper(case_sensitive=False)`, copied into tensorflow/models as
`official/legacy/transformer/compute_bleu.py`: lower-case both sides, tokenize with the
"international" rules of mteval-v14.pl (split punctuation unless it sits between digits, split
every symbol), then corpus BLEU-4 with the brevity penalty, where an n-gram order with no match
gets the precision `1 / (2^k * possible)` for its k-th such order.

sacrebleu with `tokenize="intl", lowercase=True` implements the same tokenization
(`TokenizerV14International`) and its default `smooth_method="exp"` is the same smoothing; the
remaining differences are character classes (sacrebleu keeps punctuation next to any Unicode
number `\\p{N}`, t2t only next to decimal digits `\\d`; the Unicode versions of `regex` and
`unicodedata` differ) and an empty-corpus edge case. `uncased_bleu` (sacrebleu) is the metric the
benchmark logs; `t2t_bleu` is the reference re-implemented from its published algorithm, used to
measure the gap (see README.md).
"""

from __future__ import annotations

import collections
import functools
import math
import re
import sys
import unicodedata
from collections.abc import Sequence

import sacrebleu


@functools.cache
def _t2t_patterns() -> tuple[re.Pattern, re.Pattern, re.Pattern]:
    """mteval-v14 international regexes over the Unicode categories P* and S* (built once)."""

    def chars(prefix: str) -> str:
        return "".join(
            re.escape(chr(c))
            for c in range(sys.maxunicode)
            if unicodedata.category(chr(c)).startswith(prefix)
        )

    punctuation = chars("P")
    return (
        re.compile(r"([^\d])([" + punctuation + r"])"),
        re.compile(r"([" + punctuation + r"])([^\d])"),
        re.compile("([" + chars("S") + "])"),
    )


def t2t_tokenize(text: str) -> list[str]:
    """Tokenizes one line as t2t's `bleu_hook.bleu_tokenize` (mteval-v14 international rules).

    Punctuation is split off unless it has a digit on the side in question (so "1,000" and
    "3.5" stay whole), every symbol (Unicode category S*) becomes its own token.
    """
    nondigit_punct, punct_nondigit, symbol = _t2t_patterns()
    text = nondigit_punct.sub(r"\1 \2 ", text)
    text = punct_nondigit.sub(r" \1 \2", text)
    text = symbol.sub(r" \1 ", text)
    return text.split()


def _ngram_counts(tokens: Sequence[str], max_order: int) -> collections.Counter:
    counts = collections.Counter()
    for order in range(1, max_order + 1):
        for start in range(len(tokens) - order + 1):
            counts[tuple(tokens[start : start + order])] += 1
    return counts


def t2t_compute_bleu(
    reference_corpus: Sequence[Sequence[str]],
    translation_corpus: Sequence[Sequence[str]],
    max_order: int = 4,
    use_bp: bool = True,
) -> float:
    """Corpus BLEU of tokenized sentences as t2t's `bleu_hook.compute_bleu` (one reference each).

    Returns:
      BLEU in [0, 1].
    """
    matches = [0] * max_order
    possible = [0] * max_order
    reference_length = 0
    translation_length = 0
    for reference, translation in zip(reference_corpus, translation_corpus, strict=True):
        reference_length += len(reference)
        translation_length += len(translation)
        ref_counts = _ngram_counts(reference, max_order)
        hyp_counts = _ngram_counts(translation, max_order)
        for ngram, count in ref_counts.items():
            matches[len(ngram) - 1] += min(count, hyp_counts[ngram])
        for ngram, count in hyp_counts.items():
            possible[len(ngram) - 1] += count
    precisions = [0.0] * max_order
    smooth = 1.0
    for i in range(max_order):
        if possible[i] > 0:
            if matches[i] > 0:
                precisions[i] = matches[i] / possible[i]
            else:
                smooth *= 2
                precisions[i] = 1.0 / (smooth * possible[i])
    geo_mean = 0.0
    if max(precisions) > 0:
        # Orders with no candidate n-gram at all are left out of the sum, as in t2t.
        geo_mean = math.exp(sum(math.log(p) for p in precisions if p) / max_order)
    brevity_penalty = 1.0
    if use_bp:
        ratio = translation_length / reference_length if reference_length else 0.0
        if ratio < 1e-6:
            brevity_penalty = 0.0
        elif ratio < 1.0:
            brevity_penalty = math.exp(1.0 - 1.0 / ratio)
    return geo_mean * brevity_penalty


def _check_lengths(references: Sequence[str], hypotheses: Sequence[str]) -> None:
    if len(references) != len(hypotheses):
        raise ValueError(
            f"`references` ({len(references)} lines) and `hypotheses` ({len(hypotheses)} lines) "
            "must have the same length."
        )


def t2t_bleu(
    references: Sequence[str], hypotheses: Sequence[str], case_sensitive: bool = False
) -> float:
    """MLPerf's BLEU (t2t `bleu_hook.bleu_wrapper`) on detokenized lines, in [0, 100]."""
    _check_lengths(references, hypotheses)
    if not case_sensitive:
        references = [line.lower() for line in references]
        hypotheses = [line.lower() for line in hypotheses]
    return 100.0 * t2t_compute_bleu(
        [t2t_tokenize(line) for line in references], [t2t_tokenize(line) for line in hypotheses]
    )


def uncased_bleu(
    references: Sequence[str], hypotheses: Sequence[str], tokenize: str = "intl"
) -> float:
    """Uncased corpus BLEU-4 with sacrebleu on detokenized lines, in [0, 100].

    Args:
      references: one reference per line.
      hypotheses: the system's lines, aligned with `references`.
      tokenize: sacrebleu tokenizer; "intl" matches MLPerf's t2t-style BLEU ("13a" is WMT's).

    Raises:
      ValueError: the two lists differ in length.
    """
    _check_lengths(references, hypotheses)
    if not references:
        return 0.0
    metric = sacrebleu.BLEU(tokenize=tokenize, lowercase=True)
    return float(metric.corpus_score(list(hypotheses), [list(references)]).score)
