"""Jobs: submit, read, list (with long polls) and cancel; schemas and the router."""
