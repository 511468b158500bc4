"""The run page's numbers (`GET /v1/run-stats`), read by shared/run_stats/."""
