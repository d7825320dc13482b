"""Subtask actors and the data plane: channels, credits, partitioners; the operator contract
and the plan's vertex they run."""
