"""Vector and lexical indexes (derived data, rebuilt from rows) and the embedders that feed them."""
