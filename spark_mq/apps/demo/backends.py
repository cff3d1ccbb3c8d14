"""Where the demo's orders go and its results come back, per protocol: a Malamute stream, an AMQP queue
or a STOMP destination; each backend publishes, reads the results back and cleans up after itself."""

from __future__ import annotations

import threading
from typing import Optional

__all__ = ["Backend", "MalamuteBackend", "AmqpBackend", "StompBackend", "BACKENDS"]


class Backend:
    """Protocol-specific plumbing: where the orders go, where the results come back, how to clean up."""

    fmt = ""

    def __init__(self, uri: str, run_id: str) -> None:
        self.uri = uri
        self.run_id = run_id

    def _opts(self):
        from spark_mq.options import SINK, parse_options
        return parse_options({"uri": self.uri}, format=self.fmt, direction=SINK)

    # subclasses: source_options(), sink_options(), open_producer(), publish(body, key), flush(),
    # close_producer(), start_results(callback), stop_results(), describe_results(), cleanup()


class MalamuteBackend(Backend):
    fmt = "malamute"

    def __init__(self, uri: str, run_id: str) -> None:
        super().__init__(uri, run_id)
        self.orders = f"demo.orders.{run_id}"
        self.results = f"demo.revenue.{run_id}"
        self._producer = self._reader = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def source_options(self) -> dict:
        return {"uri": self.uri, "stream": self.orders}

    def sink_options(self) -> dict:
        return {"uri": self.uri, "stream": self.results}

    def describe_results(self) -> str:
        return f"stream {self.results}"

    def open_producer(self) -> None:
        from spark_mq.clients.connect import connect_malamute
        self._producer = connect_malamute(self._opts(), f"demo-producer-{self.run_id}")
        self._producer.set_producer(self.orders)

    def publish(self, body: bytes, key: str) -> None:
        self._producer.send(key, body)

    def flush(self) -> None:
        self._producer.ping()

    def close_producer(self) -> None:
        if self._producer is not None:
            self._producer.close()

    def start_results(self, callback) -> None:
        from spark_mq.clients.connect import connect_malamute
        self._reader = connect_malamute(self._opts(), f"demo-results-{self.run_id}")
        self._reader.set_consumer(self.results, "")

        def run() -> None:
            while not self._stop.is_set():
                msg = self._reader.recv(0.2)
                if msg is not None:
                    callback(bytes(msg.content[0]) if msg.content else b"")

        self._thread = threading.Thread(target=run, name="demo-results", daemon=True)
        self._thread.start()

    def stop_results(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._reader is not None:
            self._reader.close()

    def cleanup(self) -> None:
        pass  # streams keep nothing


class AmqpBackend(Backend):
    fmt = "amqp08"

    def __init__(self, uri: str, run_id: str) -> None:
        super().__init__(uri, run_id)
        self.orders = f"spark-mq-demo.orders.{run_id}"
        self.results = f"spark-mq-demo.revenue.{run_id}"
        self._conn = self._ch = self._rconn = None
        self._pending = 0

    def source_options(self) -> dict:
        return {"uri": self.uri, "queue": self.orders, "declare": "passive"}

    def sink_options(self) -> dict:
        return {"uri": self.uri, "routingKey": self.results, "contentType": "application/json"}

    def describe_results(self) -> str:
        return f"queue {self.results}"

    def open_producer(self) -> None:
        from spark_mq.clients.connect import connect_amqp08
        self._conn = connect_amqp08(self._opts())
        self._ch = self._conn.channel()
        # both queues exist before anything is sent: nothing is dropped as unroutable
        self._ch.queue_declare(self.orders, durable=True)
        self._ch.queue_declare(self.results, durable=True)
        self._ch.tx_select()

    def publish(self, body: bytes, key: str) -> None:
        self._ch.basic_publish("", self.orders, body)
        self._pending += 1
        if self._pending >= 500:
            self.flush()

    def flush(self) -> None:
        self._ch.tx_commit()
        self._pending = 0

    def close_producer(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def start_results(self, callback) -> None:
        from spark_mq.clients.connect import connect_amqp08
        self._rconn = connect_amqp08(self._opts())
        ch = self._rconn.channel()
        ch.queue_declare(self.results, durable=True)
        ch.basic_consume(self.results, no_ack=True, on_message=lambda m: callback(bytes(m.body)))

    def stop_results(self) -> None:
        if self._rconn is not None:
            self._rconn.close()

    def cleanup(self) -> None:
        from spark_mq.clients.connect import connect_amqp08
        with connect_amqp08(self._opts()) as conn:
            ch = conn.channel()
            for q in (self.orders, self.results):
                ch.queue_delete(q)


class StompBackend(Backend):
    fmt = "stomp"

    def __init__(self, uri: str, run_id: str) -> None:
        super().__init__(uri, run_id)
        self.orders = f"/queue/spark-mq-demo.orders.{run_id}"
        self.results = f"/queue/spark-mq-demo.revenue.{run_id}"
        self._producer = self._reader = None

    def source_options(self) -> dict:
        return {"uri": self.uri, "destination": self.orders}

    def sink_options(self) -> dict:
        return {"uri": self.uri, "destination": self.results}

    def describe_results(self) -> str:
        return f"destination {self.results}"

    def open_producer(self) -> None:
        from spark_mq.clients.connect import connect_stomp
        self._producer = connect_stomp(self._opts())

    def publish(self, body: bytes, key: str) -> None:
        self._producer.send(self.orders, body)

    def flush(self) -> None:
        self._producer.flush()

    def close_producer(self) -> None:
        if self._producer is not None:
            try:
                self._producer.disconnect()
            finally:
                self._producer.close()

    def start_results(self, callback) -> None:
        from spark_mq.clients.connect import connect_stomp
        self._reader = connect_stomp(self._opts())
        self._reader.subscribe(self.results, ack="auto", on_message=lambda f: callback(bytes(f.body)))

    def stop_results(self) -> None:
        if self._reader is not None:
            self._reader.close()

    def cleanup(self) -> None:
        pass


BACKENDS = {"malamute": MalamuteBackend, "amqp08": AmqpBackend, "stomp": StompBackend}
