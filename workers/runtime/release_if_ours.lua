-- Delete a lock only while it still holds our token (another process may have taken it since it expired).
-- KEYS[1]: the lock; ARGV[1]: our token; returns 1 when released, 0 when it was not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
