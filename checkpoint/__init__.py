"""Key groups; later: checkpoint coordinator, state backends, storage."""
