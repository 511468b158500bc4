"""The service's state: liveness, the operator's status page and the Prometheus scrape."""
