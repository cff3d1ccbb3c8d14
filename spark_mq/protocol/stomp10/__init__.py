"""protocol/stomp10."""
