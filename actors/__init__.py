"""Subtask actors and the data plane: channels, credits, partitioners."""
