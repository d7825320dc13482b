"""Timer service (flat-array heaps)."""
