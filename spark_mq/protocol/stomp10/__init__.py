"""STOMP 1.0, sans-IO: frame codec (``Frame``, ``encode_frame``, ``FrameParser``), the client
session state machine (``StompSession``) and what differs between brokers (``BrokerProfile``).

Nothing here does IO; ``spark_mq.clients.stomp`` drives it over a socket.
"""

from spark_mq.protocol.stomp10._brokers import ACTIVEMQ, RABBITMQ, UNKNOWN, BrokerProfile, detect_broker
from spark_mq.protocol.stomp10._constants import (
    CLIENT_COMMANDS,
    DEFAULT_MAX_FRAME_SIZE,
    SERVER_COMMANDS,
    AckMode,
    Command,
    Header,
)
from spark_mq.protocol.stomp10._errors import (
    FrameTooLargeError,
    IncompleteFrameError,
    StompError,
    StompLocalProtocolError,
    StompRemoteProtocolError,
)
from spark_mq.protocol.stomp10._frame import Frame, encode_frame
from spark_mq.protocol.stomp10._parser import FrameParser, client_frame_parser
from spark_mq.protocol.stomp10._session import CLIENT_TRANSITIONS, SERVER_TRANSITIONS, State, StompSession, Subscription

__all__ = [
    "ACTIVEMQ",
    "RABBITMQ",
    "UNKNOWN",
    "BrokerProfile",
    "detect_broker",
    "CLIENT_COMMANDS",
    "SERVER_COMMANDS",
    "DEFAULT_MAX_FRAME_SIZE",
    "AckMode",
    "Command",
    "Header",
    "FrameTooLargeError",
    "IncompleteFrameError",
    "StompError",
    "StompLocalProtocolError",
    "StompRemoteProtocolError",
    "Frame",
    "encode_frame",
    "FrameParser",
    "client_frame_parser",
    "CLIENT_TRANSITIONS",
    "SERVER_TRANSITIONS",
    "State",
    "StompSession",
    "Subscription",
]
