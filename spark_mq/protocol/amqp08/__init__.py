"""protocol/amqp08."""
