"""The sources of messages one query reads over one connection: an option naming several, parsed.

Responsible for: turning an option that lists sources (amqp08 ``queue``, stomp ``destination``,
both comma-separated; malamute ``streams``, a JSON object of stream to pattern) into a tuple, with
errors that name the option (an empty element, a duplicate, a value that is not a string). Not
responsible for what the formats do with them (``amqp08.py``, ``stomp.py``, ``malamute.py``).
"""

from __future__ import annotations

from spark_mq.errors import OptionError
from spark_mq.options import Options

__all__ = ["name_list", "stream_patterns"]


def name_list(opts: Options, option: str, what: str) -> tuple:
    """The comma-separated names of ``option`` (each stripped of white space), in the order given;
    ``()`` when the option is not given. ``what`` names one element in errors (``queue``)."""
    text = opts.get(option)
    if not text:
        return ()
    names = tuple(part.strip() for part in text.split(","))
    if "" in names:
        raise OptionError(f"option {option!r} is {text!r}: an empty {what} in the list (give the {what}s "
                          f"separated by single commas)")
    seen: set = set()
    for name in names:
        if name in seen:
            raise OptionError(f"option {option!r} is {text!r}: {what} {name!r} is given twice (one "
                              f"connection consumes each {what} once)")
        seen.add(name)
    return names


def stream_patterns(opts: Options, option: str = "streams") -> tuple:
    """The ``(stream, pattern)`` pairs of a JSON object ``{"stream": "pattern", ...}`` (a JSON object
    cannot hold a key twice: the parser keeps the last); ``()`` when the option is not given."""
    value = opts.get(option)
    if value is None:
        return ()
    if not value:
        raise OptionError(f"option {option!r} is an empty JSON object: name at least one stream, "
                          f'e.g. {{"weather": "^temp"}}')
    pairs = []
    for stream, pattern in value.items():
        if not stream.strip():
            raise OptionError(f"option {option!r}: an empty stream name")
        if not isinstance(pattern, str):
            raise OptionError(f"option {option!r}: the pattern of stream {stream!r} is {pattern!r}, not a string "
                              f'(a zrex pattern, "" for every subject)')
        pairs.append((stream, pattern))
    return tuple(pairs)
