-- Reserve the first groups of a new batch (or more, if max_in_flight was raised).
-- KEYS[1] batch hash, KEYS[2] inflight set, KEYS[3] launching zset
-- ARGV[1] group key prefix, ARGV[2] now, ARGV[3] ttl (s)
-- Returns the reserved prompt indices (none unless the batch is running).
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return {}
end
return reserve(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], tonumber(ARGV[3]))
