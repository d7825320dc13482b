"""What every Kafka client raystream makes shares: where librdkafka's log lines go, and
the check ``execute()`` makes before a job starts that its brokers answer and its topics
are there.

librdkafka writes its log lines (``%3|...|FAIL|...``, one per reconnect to a broker that
is down) to the process's stderr. raystream's clients hand them to the Python logger
``raystream.librdkafka`` instead (confluent-kafka's ``logger`` setting), which writes
them to stderr, the worker's log file in a job's actors
(``/tmp/ray/session_latest/logs/worker-*.err``: Ray keeps their output off the driver,
:mod:`raystream.core.logs`). confluent-kafka hands a client's lines to the logger when
the client is polled, so every client is polled now and then. The driver's only clients
are the checks below, whose lines go into the error they raise.
``RAYSTREAM_LOG=debug`` leaves librdkafka's own stderr output alone.

    >>> import os
    >>> os.environ.pop("RAYSTREAM_LOG", None) and None
    >>> client_config({"bootstrap.servers": "127.0.0.1:9092"})["logger"].name
    'raystream.librdkafka'
    >>> short_cause("127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: "
    ...             "Connection refused (after 0ms in state CONNECT)")
    'Connect to ipv4#127.0.0.1:1 failed: Connection refused'
    >>> short_cause("127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection "
    ...             "refused (after 0ms in state CONNECT, 1 identical error(s) suppressed)")
    'Connect to ipv4#127.0.0.1:1 failed: Connection refused'
"""

from __future__ import annotations

import difflib
import logging
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from raystream.core.logs import verbose
from raystream.engine.errors import JobSetupError

LIBRDKAFKA_LOGGER = "raystream.librdkafka"
# The longest a check waits for a broker's answer (less if the job's timeout_s is shorter):
# a broker that is up answers a metadata request in milliseconds; one that is down is
# retried by librdkafka until then.
PREFLIGHT_TIMEOUT_S = 5.0
# How many of a broker's topics a missing topic's message lists
LISTED_TOPICS = 10

_setup_lock = threading.Lock()


def librdkafka_logger() -> logging.Logger:
    """The logger of librdkafka's lines, writing to stderr (a job actor's log file)."""
    logger = logging.getLogger(LIBRDKAFKA_LOGGER)
    with _setup_lock:
        if not logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s librdkafka %(levelname)s "
                                                   "%(message)s"))
            logger.addHandler(handler)
            # librdkafka's log_level decides what it sends; raystream's own loggers and a
            # user's root handlers do not get it twice
            logger.setLevel(logging.DEBUG)
            logger.propagate = False
    return logger


def client_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka ``settings`` with its log lines sent to :func:`librdkafka_logger`
    (unless verbose, or the job set a ``logger`` of its own)."""
    if verbose():
        return dict(settings)
    return {"logger": librdkafka_logger(), **settings}


def serve_logs(client: Any) -> None:
    """Hand the log lines ``client`` queued to the logger (confluent-kafka does only on a
    poll). Only for a client that is assigned no partitions: a consumer's poll would take
    a record."""
    client.poll(0)


def short_cause(message: str) -> str:
    """A librdkafka error without the broker prefix and the state suffix it repeats."""
    message = re.sub(r"^\S+/\S+: ", "", message)
    return re.sub(r" \(after \d+ms in state .*\)$", "", message)


class _ClientErrors:
    """The errors a client reports while it tries (``error_cb``), for the cause of a
    failed check: the last one that is not "all brokers are down"."""

    def __init__(self) -> None:
        self.last: str | None = None

    def __call__(self, error: Any) -> None:
        from confluent_kafka import KafkaError

        if error.code() != KafkaError._ALL_BROKERS_DOWN:
            self.last = short_cause(error.str())


@dataclass(frozen=True)
class BrokerCheck:
    """What one preflight check asks a broker: ``call`` names the user's call in the
    messages (``read_kafka('host:9092')``)."""

    call: str
    bootstrap_servers: str
    timeout_s: float

    def metadata(self, make_client: Callable[[dict[str, Any]], Any], topic: str | None = None
                 ) -> Any:
        """The broker's metadata (of every topic, or of ``topic`` only, as a producer asks:
        a broker that creates topics on demand creates it), from a client made with the
        settings given; a :class:`JobSetupError` naming the broker and the cause if it does
        not answer in time."""
        from confluent_kafka import KafkaException

        errors = _ClientErrors()
        settings: dict[str, Any] = {"error_cb": errors}
        if not verbose():  # its lines are summed up in the error (the cause)
            quiet = logging.getLogger(f"{LIBRDKAFKA_LOGGER}.preflight")
            quiet.propagate = False
            if not quiet.handlers:
                quiet.addHandler(logging.NullHandler())
            settings["logger"] = quiet
        client = make_client(settings)
        timeout = min(self.timeout_s, PREFLIGHT_TIMEOUT_S)
        try:
            return client.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            client.poll(0)  # the errors it met meanwhile
            cause = errors.last or short_cause(exc.args[0].str())
            raise JobSetupError(
                f"{self.call}: no answer from the Kafka broker at {self.bootstrap_servers} "
                f"within {timeout:g} s ({cause}): start it, or name the address it listens "
                f"on (and its security settings, such as security_protocol=...)") from None
        finally:
            client.poll(0)
            if hasattr(client, "close"):  # a consumer (it joined no group: at once)
                client.close()

    def missing_topic(self, topic: str, metadata: Any, state: str) -> JobSetupError:
        """The error of a topic that is not there to read or write: ``state`` says how
        (``"does not exist"``)."""
        names = sorted(t for t in metadata.topics if not t.startswith("__"))
        close = difflib.get_close_matches(topic, names, n=1, cutoff=0.6)
        listed = ", ".join(names[:LISTED_TOPICS]) + (", ..." if len(names) > LISTED_TOPICS
                                                     else "")
        return JobSetupError(
            f"{self.call}: topic '{topic}' on the Kafka broker at {self.bootstrap_servers} "
            f"{state}: create it (kafka-topics.sh --create --topic {topic}) or name another "
            f"(its topics: {listed or 'none'}" + (f"; did you mean '{close[0]}'?)" if close
                                                  else ")"))
