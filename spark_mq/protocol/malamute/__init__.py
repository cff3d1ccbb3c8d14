"""Malamute protocol: wire codec (``codec``), subject patterns (``patterns``) and the sans-IO client
state machine (``client``). Nothing here imports zmq, sockets, threads or time."""

from spark_mq.protocol.malamute.client import ClientConnection, State
from spark_mq.protocol.malamute.errors import MalamuteBrokerError
from spark_mq.protocol.malamute.patterns import PatternError, compile_pattern, validate_pattern

__all__ = ["ClientConnection", "MalamuteBrokerError", "PatternError", "State", "compile_pattern",
           "validate_pattern"]
