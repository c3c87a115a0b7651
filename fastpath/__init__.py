"""Compiled hot path of Context Sidecar (Cython), with its plain-Python twin in fastpath.reference.

One extension module per concern, each with a reference twin of the same name in fastpath.reference:
_selection (fuse_scores, ranking_order, dedup, greedy_pack, select, arrange), _textkeys (tokenize,
fnv1a64, text_keys, hash_embed, WordTable, word_vector_sums, word_terms, has_token_run,
NeedleSet), _wire (encode_item, encode_section,
encode_dropped), _ranking (overlap_counts, best_matches, fused_top_k, hybrid_top_k, window_bm25,
cooccurring_terms, feedback_terms, newer_first), _int8 (int8_dot) and _marks (voice, capitalised); _common holds their shared
input validation.

The compiled extensions are mandatory: if one is missing the import fails loudly rather than silently
falling back to the (100x slower) reference.
"""

from fastpath import reference

try:
    from fastpath._int8 import int8_dot
    from fastpath._marks import capitalised, voice
    from fastpath._ranking import (
        best_matches,
        cooccurring_terms,
        feedback_terms,
        fused_top_k,
        hybrid_top_k,
        newer_first,
        overlap_counts,
        window_bm25,
    )
    from fastpath._selection import (
        DUPLICATE,
        LOW_SCORE,
        OVER_BUDGET,
        SELECTED,
        arrange,
        dedup,
        fuse_scores,
        greedy_pack,
        ranking_order,
        select,
    )
    from fastpath._textkeys import (
        NeedleSet,
        WordTable,
        fnv1a64,
        has_token_run,
        hash_embed,
        text_keys,
        tokenize,
        word_terms,
        word_vector_sums,
    )
    from fastpath._wire import encode_dropped, encode_item, encode_section
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    raise ImportError(
        f"fastpath's compiled extensions are not built ({exc}); "
        "run `python setup.py build_ext --inplace` or `pip install -e .`"
    ) from exc

# One result type for both implementations, so isinstance checks and field access never differ.
Selection = reference.Selection

__all__ = [
    "DUPLICATE",
    "LOW_SCORE",
    "NeedleSet",
    "OVER_BUDGET",
    "SELECTED",
    "Selection",
    "WordTable",
    "arrange",
    "best_matches",
    "capitalised",
    "cooccurring_terms",
    "dedup",
    "encode_dropped",
    "encode_item",
    "encode_section",
    "feedback_terms",
    "fnv1a64",
    "fuse_scores",
    "fused_top_k",
    "greedy_pack",
    "has_token_run",
    "hash_embed",
    "hybrid_top_k",
    "int8_dot",
    "newer_first",
    "overlap_counts",
    "ranking_order",
    "reference",
    "select",
    "text_keys",
    "tokenize",
    "voice",
    "window_bm25",
    "word_terms",
    "word_vector_sums",
]
