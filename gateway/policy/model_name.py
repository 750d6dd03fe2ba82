"""Which model a request is for: the one thing the data planes read from a request.

- HTTP: the path, ``/v2/models/<name>[/versions/<v>]/infer`` (percent-decoded).
- gRPC ``ModelInfer`` / ``ModelStreamInfer``: field 1 (``model_name``) of the protobuf
  message, read from the wire bytes without decoding the rest (a request with megabytes
  of ``raw_input_contents`` is never parsed in the gateway). HAProxy reads it with its
  ``protobuf(1)`` converter from the buffered start of the body; the Python plane with
  :func:`grpc_model_name`. A message whose field 1 cannot be read (malformed or cut
  short before it ends), is absent or is empty names no model: 400 / INVALID_ARGUMENT,
  the same on both planes, before anything else is decided.

Whether a ``ModelInferRequest`` parses is Triton's to say, on both planes: HAProxy
forwards the bytes as sent, and so does the Python plane unless it appends fields (the
deadline, a rollout's pinned version). It appends only to a message that is whole at its
top level (:func:`grpc_message_whole`): appended to a message cut short, the fields
could complete what the client cut (a ``raw_input_contents`` 13 bytes short takes the
first 13 bytes of the ``timeout`` parameter) and Triton would run a request that does
not parse.
"""

from __future__ import annotations

from gateway.errors import InvalidInput

HTTP_INFER_PATTERN = r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$"
HTTP_UNVERSIONED_INFER_PATTERN = r"^/v2/models/[^/]+/infer$"
GRPC_MODEL_FIELD = 1
GRPC_VERSION_FIELD = 2
GRPC_STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
UNKNOWN_MODEL = "Request for unknown model: '{model}' is not found"  # Triton's words
NO_MODEL = ("the request names no model: field 1 (model_name) of the ModelInferRequest "
            "is missing, empty or malformed")
NOT_UTF8 = "the model name (field 1 of the ModelInferRequest) is not valid UTF-8"


def grpc_model_name(message: bytes) -> str:
    """The model a ``ModelInferRequest``'s wire bytes name; InvalidInput when none."""
    raw = _first_length_delimited(message, GRPC_MODEL_FIELD)
    if not raw:
        raise InvalidInput(NO_MODEL)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(NOT_UTF8) from None


def grpc_names_version(message: bytes) -> bool:
    """Whether a ``ModelInferRequest``'s wire bytes name a version (field 2, non-empty)."""
    return bool(_first_length_delimited(message, GRPC_VERSION_FIELD))


def grpc_message_whole(message: bytes) -> bool:
    """Whether every top-level field of a message's wire bytes is well-formed and ends
    within them, the last exactly at their end: fields appended after it are fields of
    their own. A walk over the fields' keys and lengths (a few per ``ModelInferRequest``),
    not a parse: the tensors' bytes are skipped, not read, and nested messages are not
    looked into. Keys and lengths under 128 (one byte) are read inline."""
    pos, end = 0, len(message)
    while pos < end:
        key = message[pos]
        if key & 0x80:
            key, pos = _varint(message, pos)
            if pos < 0:
                return False
        else:
            pos += 1
        wire_type = key & 7
        if wire_type == 2:
            if pos < end and not message[pos] & 0x80:
                pos += 1 + message[pos]
            else:
                length, pos = _varint(message, pos)
                if pos < 0:
                    return False
                pos += length
        elif wire_type == 0:
            pos = _varint(message, pos)[1]
            if pos < 0:
                return False
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
        else:
            return False
    return pos == end


def _first_length_delimited(message: bytes, field_number: int) -> bytes | None:
    """The first occurrence of a length-delimited field; None when the bytes before it
    (or the field itself) are not well-formed, or it is absent."""
    pos, end = 0, len(message)
    while pos < end:
        key, pos = _varint(message, pos)
        if pos < 0:
            return None
        number, wire_type = key >> 3, key & 7
        if wire_type == 2:
            length, pos = _varint(message, pos)
            if pos < 0 or pos + length > end:
                return None
            if number == field_number:
                return message[pos : pos + length]
            pos += length
        elif wire_type == 0:
            _, pos = _varint(message, pos)
            if pos < 0:
                return None
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
        else:
            return None
    return None


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it); position -1 when truncated or longer than 10 bytes."""
    result, shift = 0, 0
    for i in range(pos, min(len(data), pos + 10)):
        byte = data[i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, i + 1
        shift += 7
    return 0, -1
