"""Context compression: pinned constraints, trimmed tool views, rolling summaries."""
