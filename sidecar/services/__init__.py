"""Domain services: validation and business rules over the Store. The gRPC layer only translates."""
