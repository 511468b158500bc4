-- Pick (or keep) the backend of one trajectory, atomically.
-- KEYS: 1 load zset, 2 usable set, 3 inflight hash, 4 capacity hash, 5 routes hash,
--       6 route_refs hash, 7 charges hash, 8 leases zset, 9 lease_routes hash
-- ARGV: 1 trajectory id, 2 route key (trajectory or GRPO group id), 3 lease expiry (unix s)
-- Returns {backend id, 1 if the route moved off an unusable backend else 0}, or false when
-- no backend is open to new pins.
local load, usable, inflight, capacity = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local routes, refs, charges, leases, lease_routes = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local traj, route, expiry = ARGV[1], ARGV[2], ARGV[3]

-- ZADD XX only rescores members already present, so a drained or unhealthy backend stays out.
local function rescore(id)
  local cap = tonumber(redis.call('HGET', capacity, id) or '1') or 1
  local n = tonumber(redis.call('HGET', inflight, id) or '0') or 0
  redis.call('ZADD', load, 'XX', n / cap, id)
end

local target = redis.call('HGET', routes, route)
local repinned = 0
if not target or redis.call('SISMEMBER', usable, target) == 0 then
  local best = redis.call('ZRANGE', load, 0, 0)
  if #best == 0 then
    return false
  end
  if target then
    repinned = 1
  end
  target = best[1]
  redis.call('HSET', routes, route, target)
end

-- Route membership: how many live trajectories share this pin (more than one with group pinning).
local previous = redis.call('HGET', lease_routes, traj)
if previous ~= route then
  if previous then
    local left = redis.call('HINCRBY', refs, previous, -1)
    if left <= 0 then
      redis.call('HDEL', refs, previous)
      redis.call('HDEL', routes, previous)
    end
  end
  redis.call('HINCRBY', refs, route, 1)
  redis.call('HSET', lease_routes, traj, route)
end

-- In-flight counts are per trajectory: move this trajectory's charge to the target if needed.
local charged = redis.call('HGET', charges, traj)
if charged ~= target then
  if charged and redis.call('HEXISTS', inflight, charged) == 1 then
    if redis.call('HINCRBY', inflight, charged, -1) < 0 then
      redis.call('HSET', inflight, charged, 0)
    end
    rescore(charged)
  end
  redis.call('HINCRBY', inflight, target, 1)
  rescore(target)
  redis.call('HSET', charges, traj, target)
end

redis.call('ZADD', leases, expiry, traj)
return {target, repinned}
