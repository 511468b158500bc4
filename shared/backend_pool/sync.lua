-- Bring one backend's set memberships in line with its registration hash.
-- KEYS: 1 backend hash, 2 ids set, 3 usable set, 4 load zset, 5 inflight hash, 6 capacity hash,
--       7 models hash
-- ARGV: 1 backend id
-- A missing hash means deregistered: the backend leaves every set and its count is dropped
-- (trajectories charged to it re-pin at their next call).
local backend, ids, usable, load, inflight, capacity = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local models = KEYS[7]
local id = ARGV[1]

if redis.call('EXISTS', backend) == 0 then
  redis.call('SREM', ids, id)
  redis.call('SREM', usable, id)
  redis.call('ZREM', load, id)
  redis.call('HDEL', inflight, id)
  redis.call('HDEL', capacity, id)
  redis.call('HDEL', models, id)
  return 0
end

local f = redis.call('HMGET', backend, 'capacity', 'healthy', 'draining', 'model')
local cap = tonumber(f[1]) or 1
redis.call('SADD', ids, id)
redis.call('HSET', capacity, id, cap)
redis.call('HSET', models, id, f[4] or '')
if redis.call('HEXISTS', inflight, id) == 0 then
  redis.call('HSET', inflight, id, 0)
end
if f[2] == '1' then
  redis.call('SADD', usable, id)
  if f[3] == '1' then
    redis.call('ZREM', load, id)
  else
    local n = tonumber(redis.call('HGET', inflight, id)) or 0
    redis.call('ZADD', load, n / cap, id)
  end
else
  redis.call('SREM', usable, id)
  redis.call('ZREM', load, id)
end
return 1
