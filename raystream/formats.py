"""Value formats of the Kafka source and sink: ``value_format=rs.formats.Avro(...)``.

``value_format="json"``, ``"raw"``, ``"avro"`` and ``"protobuf"`` name them; the
classes here take the options a name cannot (Confluent's framing for Avro, say).
See :mod:`raystream.engine.formats`.

    >>> import raystream as rs
    >>> rs.formats.Avro({"type": "record", "name": "R",
    ...                  "fields": [{"name": "n", "type": "long"}]}).arrow_schema
    n: int64
"""

from raystream.engine.formats import Avro, FormatError, Json, Protobuf, Raw, ValueFormat

__all__ = ["Avro", "FormatError", "Json", "Protobuf", "Raw", "ValueFormat"]
