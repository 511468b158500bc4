"""The HTTP API: FastAPI routes, request/response schemas and auth."""
