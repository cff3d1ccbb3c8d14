"""The commands of ``spark-mq``, one module each: ``demo``, ``broker``, ``send``, ``tail``, ``bridge``.

Each module has ``add_parser(sub)``, which adds its sub-command to the parser of ``spark_mq.apps.cli``,
and ``run(args) -> int``, the exit status (``demo.run`` takes the raw arguments: the demo parses its
own). ``common`` holds the errors, exit statuses and helpers all of them share; ``target`` the flags
and the target (queue, destination, stream, ...) that ``send`` and ``tail`` share.
"""
