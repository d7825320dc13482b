"""The web UI: the cluster's jobs, each job's graph with live rates, backpressure and
watermark lag, its checkpoint history, failures, and savepoint / stop / cancel buttons.

``raystream ui`` serves it (see :mod:`raystream.engine.ui.server`); a driver that starts
a job serves it too, on loopback, and prints its address (``RAYSTREAM_UI=0``: not).
"""
