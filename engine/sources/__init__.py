"""Split-based sources."""
