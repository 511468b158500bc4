-- Recount every backend's in-flight trajectories from the charges hash (the source of truth),
-- so a count corrupted by any path (a re-registered id, a lost reply) heals on the next pass.
-- KEYS: 1 charges hash, 2 inflight hash, 3 capacity hash, 4 load zset
-- Returns the number of backends whose count was wrong.
local charges, inflight, capacity, load = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local truth = {}
local flat = redis.call('HGETALL', charges)
for i = 2, #flat, 2 do
  truth[flat[i]] = (truth[flat[i]] or 0) + 1
end
local corrected = 0
local current = redis.call('HGETALL', inflight)
for i = 1, #current, 2 do
  local id, n = current[i], tonumber(current[i + 1])
  local want = truth[id] or 0
  if n ~= want then
    redis.call('HSET', inflight, id, want)
    local cap = tonumber(redis.call('HGET', capacity, id) or '1') or 1
    redis.call('ZADD', load, 'XX', want / cap, id)
    corrected = corrected + 1
  end
end
return corrected
