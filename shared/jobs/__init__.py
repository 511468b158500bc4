"""Job records: the request schema, statuses and the Redis store."""
