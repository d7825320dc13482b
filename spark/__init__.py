"""Spark integration: sessions through RayDP and hand-off of results into DataFrames."""

from raystream.spark.commit_log import read_committed
from raystream.spark.handoff import to_spark
from raystream.spark.session import session, stop

__all__ = ["session", "stop", "to_spark"]
