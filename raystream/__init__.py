"""raystream: exactly-once, event-time stream processing for Python on Ray, feeding Spark.

    >>> import pyarrow.compute as pc, raystream as rs
    >>> env = rs.StreamEnvironment(parallelism=2)
    >>> sink = env.from_sequence(100).filter_batches(lambda b: pc.less(b["id"], 10)).collect()
    >>> env.execute("small").table(sink).num_rows  # doctest: +SKIP
    10
"""

from raystream import formats, sources, spark
from raystream.checkpoint.config import CheckpointConfig, RestartStrategy
from raystream.checkpoint.disk_db import DiskStateOptions
from raystream.checkpoint.heap_changelog import HeapStateOptions
from raystream.core.failpoints import Failpoint
from raystream.checkpoint.keygroups import (HASH_VERSION, key_group_of, key_group_range,
                                            subtask_for_key_group)
from raystream.engine.client import JobClient, JobResult
from raystream.checkpoint.ttl import StateTtlConfig, TtlUpdate, TtlVisibility
from raystream.engine.datastream import (BroadcastConnectedStream, BroadcastStream,
                                         ConnectedStreams, DataStream, KeyedStream)
from raystream.engine.interval_join_stream import IntervalJoin, IntervalJoined
from raystream.engine.sink_handle import SinkHandle
from raystream.engine.environment import StreamEnvironment
from raystream.engine.errors import (AsyncTimeoutError, BadRecordError, FileReadError, InsufficientResourcesError,
                                     JobFailedError, JobFailedOnBadRecord, JobFailedOnFileRead,
                                     JobNotFoundError, JobNotRunningError, JobSetupError,
                                     JobStillRunningError,
                                     RaystreamError, SavepointFailedError, SchemaError, SqlError)
from raystream.checkpoint.operator_coordinator import (OperatorCoordinator,
                                                        OperatorCoordinatorContext,
                                                        SubtaskEventGateway)
from raystream.actors.operator import Operator, RuntimeContext, SourceOperator
from raystream.engine.operators.keyed import KeyedContext, KeyedProcessFunction
from raystream.engine.operators.co_process import KeyedCoProcessFunction
from raystream.engine.operators.interval_join import (IntervalBounds, JoinContext,
                                                      ProcessJoinFunction)
from raystream.engine.operators.broadcast import (
    BroadcastContext, BroadcastProcessFunction, BroadcastState, KeyedBroadcastContext,
    KeyedBroadcastProcessFunction, KeyedReadOnlyContext, MapStateDescriptor,
    ReadOnlyBroadcastState, ReadOnlyContext)
from raystream.engine.operators.async_io import AsyncRetry
from raystream.engine.operators.two_phase import Committer, SinkContext, SinkWriter
from raystream.engine.operators.kafka_sink import KafkaSinkError
from raystream.engine.sources.kafka import KafkaError, KafkaRecordError
from raystream.engine.watermarks import BoundedOutOfOrderness
from raystream.engine.sql.udf import udf
from raystream.engine.windows.assigners import (CumulativeEventTimeWindows,
                                                DynamicEventTimeSessionWindows,
                                                EventTimeSessionWindows, GlobalWindows,
                                                SlidingEventTimeWindows,
                                                TumblingEventTimeWindows,
                                                TumblingProcessingTimeWindows)
from raystream.engine.windows.triggers import (ContinuousEventTimeTrigger,
                                               ContinuousProcessingTimeTrigger, CountTrigger,
                                               EventTimeTrigger, NeverTrigger,
                                               ProcessingTimeTrigger, PurgingTrigger, Trigger,
                                               TriggerResult)
from raystream.engine.windows.functions import ProcessWindowFunction, Window
from raystream.engine.windows.join import WindowedTwoStreams
from raystream.engine.windows.operator import WINDOW_TIME
from raystream.engine.windows.stream import CountWindowedStream, WindowedStream
from raystream.actors.messages import MAX_WATERMARK, MIN_WATERMARK

__all__ = [
    "AsyncRetry", "AsyncTimeoutError", "BadRecordError", "BoundedOutOfOrderness", "FileReadError", "CheckpointConfig", "Committer",
    "ConnectedStreams", "DiskStateOptions", "HeapStateOptions", "SinkContext", "SinkWriter",
    "DataStream", "Failpoint", "RestartStrategy",
    "HASH_VERSION", "InsufficientResourcesError", "KafkaError", "KafkaRecordError",
    "KafkaSinkError", "JobClient", "JobFailedError", "JobFailedOnBadRecord",
    "JobFailedOnFileRead", "JobNotFoundError", "JobSetupError",
    "JobNotRunningError", "JobResult", "JobStillRunningError",
    "KeyedContext", "KeyedProcessFunction", "KeyedStream", "MAX_WATERMARK", "MIN_WATERMARK", "Operator", "RaystreamError",
    "OperatorCoordinator", "OperatorCoordinatorContext", "SourceOperator", "SubtaskEventGateway",
    "RuntimeContext", "SavepointFailedError", "SchemaError", "SqlError", "SinkHandle", "StreamEnvironment", "key_group_of", "udf",
    "key_group_range",
    "formats", "sources", "spark", "subtask_for_key_group",
    "DynamicEventTimeSessionWindows", "EventTimeSessionWindows", "GlobalWindows",
    "CumulativeEventTimeWindows", "ProcessWindowFunction", "SlidingEventTimeWindows",
    "ContinuousEventTimeTrigger", "ContinuousProcessingTimeTrigger", "CountTrigger",
    "EventTimeTrigger", "NeverTrigger", "ProcessingTimeTrigger", "PurgingTrigger", "Trigger",
    "TriggerResult",
    "TumblingEventTimeWindows", "TumblingProcessingTimeWindows", "Window", "WINDOW_TIME",
    "WindowedStream", "CountWindowedStream",
    "IntervalBounds", "IntervalJoin", "IntervalJoined", "JoinContext", "KeyedCoProcessFunction",
    "ProcessJoinFunction", "WindowedTwoStreams",
    "StateTtlConfig", "TtlUpdate", "TtlVisibility",
    "BroadcastConnectedStream", "BroadcastContext", "BroadcastProcessFunction",
    "BroadcastState", "BroadcastStream", "KeyedBroadcastContext",
    "KeyedBroadcastProcessFunction", "KeyedReadOnlyContext", "MapStateDescriptor",
    "ReadOnlyBroadcastState", "ReadOnlyContext",
]

# last: it reads the names above (raystream.nexmark's queries use the public API)
from raystream.nexmark import sql_connector as _nexmark_sql  # noqa: F401  (registers SQL's nexmark connector)
