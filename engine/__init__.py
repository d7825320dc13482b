"""Job API, planning, job master and operators."""
