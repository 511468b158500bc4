"""What every stage's worker process shares: the rq slot workers, the stage runner, cancel handling."""
