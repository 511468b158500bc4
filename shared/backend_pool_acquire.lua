-- Pick (or keep) the backend of one trajectory, atomically.
-- KEYS: 1 load zset, 2 usable set, 3 inflight hash, 4 capacity hash, 5 routes hash,
--       6 route_refs hash, 7 charges hash, 8 leases zset, 9 lease_routes hash
-- ARGV: 1 trajectory id, 2 route key (trajectory or GRPO group id), 3 lease expiry (unix s),
--       4.. backend ids to avoid for this call (they failed it: timeout, errors, garbage)
-- Returns {backend id, 1 if this trajectory moved off the backend it was charged to else 0},
-- or false when no backend (outside the excluded ones) is open to new pins.
--
-- A trajectory already charged to a usable backend (healthy; draining included, so pinned
-- work finishes there) stays on it. Otherwise (a new trajectory, or its backend is gone or
-- excluded) it takes the route's pin if that backend is open to new pins (in `load`:
-- healthy and not draining), else the least-loaded open backend, which becomes the route's
-- pin. So a new member of a group pinned to a draining or unhealthy backend is never
-- charged there, and the members already running on a draining one are not moved.
local load, usable, inflight, capacity = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local routes, refs, charges, leases, lease_routes = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local traj, route, expiry = ARGV[1], ARGV[2], ARGV[3]
local excluded = {}
for i = 4, #ARGV do
  excluded[ARGV[i]] = true
end

-- ZADD XX only rescores members already present, so a drained or unhealthy backend stays out.
local function rescore(id)
  local cap = tonumber(redis.call('HGET', capacity, id) or '1') or 1
  local n = tonumber(redis.call('HGET', inflight, id) or '0') or 0
  redis.call('ZADD', load, 'XX', n / cap, id)
end

local function open_to_pins(id)
  return id and not excluded[id] and redis.call('ZSCORE', load, id) ~= false
end

-- The least-loaded open backend that is not excluded: among the first (#excluded + 1).
local function least_loaded()
  for _, id in ipairs(redis.call('ZRANGE', load, 0, #ARGV - 3)) do
    if not excluded[id] then
      return id
    end
  end
  return nil
end

local charged = redis.call('HGET', charges, traj)
local target
if charged and not excluded[charged] and redis.call('SISMEMBER', usable, charged) == 1 then
  target = charged
else
  target = redis.call('HGET', routes, route)
  if not open_to_pins(target) then
    target = least_loaded()
    if not target then
      return false
    end
    redis.call('HSET', routes, route, target)
  end
end
local repinned = 0
if charged and charged ~= target then
  repinned = 1
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
