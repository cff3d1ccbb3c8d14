"""Each format's ``Consumer`` and its source-specific pieces (``amqp08``, ``stomp``, ``malamute``).

Responsible for: per format, the options it checks (``validate``), its ``Consumer`` subclass over
the format's client and ``connect_consumer``; the ingest, the log and Spark's side in
``spark_mq.sources`` are shared. ``spark_mq.datasources`` joins each with its sink. The former
modules ``spark_mq.sources.<format>`` are compatibility shims for users and nothing here imports them.
"""
