"""Knowledge base building blocks: document chunking, relation extraction and graph traversal.

Pure Python (standard library only); storage and gRPC wiring live elsewhere."""
