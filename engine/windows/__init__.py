"""Windows on the timer service: assigners, aggregates, the window operator and pre-aggregation."""
