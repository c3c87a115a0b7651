"""Compiled hot path of Context Sidecar (Cython), with its plain-Python twin in fastpath.reference.

The compiled extension is mandatory: if it is missing the import fails loudly rather than silently
falling back to the (100x slower) reference.
"""

from fastpath import reference

try:
    from fastpath._core import (
        DUPLICATE,
        LOW_SCORE,
        OVER_BUDGET,
        SELECTED,
        arrange,
        best_matches,
        cooccurring_terms,
        dedup,
        encode_dropped,
        encode_item,
        encode_section,
        feedback_terms,
        fnv1a64,
        fuse_scores,
        fused_top_k,
        greedy_pack,
        hash_embed,
        hybrid_top_k,
        int8_dot,
        overlap_counts,
        ranking_order,
        select,
        text_keys,
        tokenize,
        window_bm25,
    )
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    raise ImportError(
        "fastpath._core is not built; run `python setup.py build_ext --inplace` or `pip install -e .`"
    ) from exc

# One result type for both implementations, so isinstance checks and field access never differ.
Selection = reference.Selection

__all__ = [
    "DUPLICATE",
    "LOW_SCORE",
    "OVER_BUDGET",
    "SELECTED",
    "Selection",
    "arrange",
    "best_matches",
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
    "hash_embed",
    "hybrid_top_k",
    "int8_dot",
    "overlap_counts",
    "ranking_order",
    "reference",
    "select",
    "text_keys",
    "tokenize",
    "window_bm25",
]
