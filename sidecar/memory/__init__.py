"""Long-term memory: candidate extraction and filtering."""
