"""Init stage: builds each job's state (workspace, sandbox image) on shared storage."""
