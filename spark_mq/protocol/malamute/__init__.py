"""protocol/malamute."""
