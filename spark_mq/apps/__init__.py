"""The applications, on top of every other layer of spark_mq: the ``spark-mq`` command
(``spark_mq.apps.cli``, one module per command under ``spark_mq.apps.commands``), the end-to-end demo
(``spark_mq.apps.demo``, also ``spark-mq demo``) and the bridge job behind ``spark-mq bridge``
(``spark_mq.apps.bridge_job``). They use the public clients and formats only; nothing below imports them.
"""
