-- End trajectories: uncharge their backend and drop their share of the route pin.
-- KEYS: as pool_acquire.lua
-- ARGV: 1 cutoff: '-' releases unconditionally; a unix time releases only leases that expired
--       by then (the reaper: a lease refreshed since it was listed is left alone); 2.. trajectory ids
-- Returns the number of trajectories released.
local load, usable, inflight, capacity = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local routes, refs, charges, leases, lease_routes = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local cutoff = ARGV[1]

local function rescore(id)
  local cap = tonumber(redis.call('HGET', capacity, id) or '1') or 1
  local n = tonumber(redis.call('HGET', inflight, id) or '0') or 0
  redis.call('ZADD', load, 'XX', n / cap, id)
end

local released = 0
for i = 2, #ARGV do
  local traj = ARGV[i]
  local expiry = redis.call('ZSCORE', leases, traj)
  local route = redis.call('HGET', lease_routes, traj)
  local due = cutoff == '-' or (expiry and tonumber(expiry) <= tonumber(cutoff))
  if due and (expiry or route) then
    local charged = redis.call('HGET', charges, traj)
    if charged and redis.call('HEXISTS', inflight, charged) == 1 then
      if redis.call('HINCRBY', inflight, charged, -1) < 0 then
        redis.call('HSET', inflight, charged, 0)
      end
      rescore(charged)
    end
    if route then
      if redis.call('HINCRBY', refs, route, -1) <= 0 then
        redis.call('HDEL', refs, route)
        redis.call('HDEL', routes, route)
      end
    end
    redis.call('HDEL', charges, traj)
    redis.call('HDEL', lease_routes, traj)
    redis.call('ZREM', leases, traj)
    released = released + 1
  end
end
return released
