"""Spark integration: sessions through RayDP, committed output as DataFrames, hand-off of results."""

from raystream.spark.commit_log import read_committed
from raystream.spark.handoff import release_unused, to_spark
from raystream.spark.reader import read, read_stream
from raystream.spark.session import session, stop

__all__ = ["read", "read_committed", "read_stream", "release_unused", "session", "stop",
           "to_spark"]
