"""Logging set-up shared by every process: plain text, or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time

from shared.config import Settings
from shared.log_context import ContextFilter


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for field in ("job_id", "stage", "backend"):
            if hasattr(record, field):
                entry[field] = getattr(record, field)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())  # job id, stage, backend of the stage this thread runs
    if settings.log_json:
        handler.setFormatter(JsonFormatter())
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s%(context)s: %(message)s")
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    # Per-request client logs (health probes every few seconds) drown everything else at INFO.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))
    # rq writes a line or more per job ("Job OK", "Result is kept..."): thousands in a day's log.
    logging.getLogger("rq").setLevel(settings.rq_log_level.upper())
