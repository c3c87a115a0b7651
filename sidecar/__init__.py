"""Context Sidecar: a gRPC service that assembles an agent's context window and owns its memory."""

__version__ = "0.1.0"
