-- Pick (or keep) the backend of one trajectory, atomically.
-- KEYS: 1 load zset, 2 usable set, 3 inflight hash, 4 capacity hash, 5 routes hash,
--       6 route_refs hash, 7 charges hash, 8 leases zset, 9 lease_routes hash, 10 models hash
-- ARGV: 1 trajectory id, 2 route key (trajectory or GRPO group id), 3 lease expiry (unix s),
--       4 model the trajectory needs ('' = any), 5 load ceiling (see below),
--       6 prefix of the backends' registration hashes (Keys.backend('')),
--       7.. backend ids to avoid for this call (they failed it: timeout, errors, garbage)
-- Returns {backend id, 1 if this trajectory moved off the backend it was charged to else 0,
-- and its registration's url, model and tokenizer (false when it was just deregistered)},
-- or false when no backend of the model (outside the excluded ones) is open to new pins.
-- The registration is read here, in the same atomic step, so a worker never uses a stale
-- copy of it (a backend re-registered with another model or tokenizer under the same id).
--
-- A trajectory already charged to a usable backend (healthy; draining included, so pinned
-- work finishes there) stays on it: its prefix cache is there. Otherwise (a new trajectory,
-- or its backend is gone or excluded) it takes the route's pin if that backend is open to
-- new pins (in `load`: healthy and not draining) and not above the load ceiling, else the
-- least-loaded open backend, which becomes the route's pin. The ceiling: a pinned backend
-- whose in-flight per unit of capacity exceeds the least-loaded one's by more than ARGV[5]
-- yields new trajectories of its route to the least loaded (a shared prefix is worth less than
-- a queue). Only backends serving the trajectory's model are ever picked: its token ids mean
-- nothing to another model.
local load, usable, inflight, capacity = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local routes, refs, charges, leases, lease_routes, models = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local traj, route, expiry, model, ceiling = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local registration_prefix = ARGV[6]
local excluded = {}
for i = 7, #ARGV do
  excluded[ARGV[i]] = true
end

-- ZADD XX only rescores members already present, so a drained or unhealthy backend stays out.
local function rescore(id)
  local cap = tonumber(redis.call('HGET', capacity, id) or '1') or 1
  local n = tonumber(redis.call('HGET', inflight, id) or '0') or 0
  redis.call('ZADD', load, 'XX', n / cap, id)
end

local function serves_model(id)
  return model == '' or redis.call('HGET', models, id) == model
end

local function open_to_pins(id)
  return id and not excluded[id] and serves_model(id) and redis.call('ZSCORE', load, id) ~= false
end

-- The least-loaded open backend of the model that is not excluded, with its score; pages
-- through `load` in score order (one page when every backend serves the same model).
local function least_loaded()
  local page = 16
  local offset = 0
  while true do
    local ids = redis.call('ZRANGE', load, offset, offset + page - 1, 'WITHSCORES')
    if #ids == 0 then
      return nil, nil
    end
    for i = 1, #ids, 2 do
      local id = ids[i]
      if not excluded[id] and serves_model(id) then
        return id, tonumber(ids[i + 1])
      end
    end
    offset = offset + page
  end
end

local charged = redis.call('HGET', charges, traj)
local target
if charged and not excluded[charged] and serves_model(charged) and redis.call('SISMEMBER', usable, charged) == 1 then
  target = charged
else
  target = redis.call('HGET', routes, route)
  local least, least_score = least_loaded()
  if not least then
    return false
  end
  if not open_to_pins(target) or tonumber(redis.call('ZSCORE', load, target)) > least_score + ceiling then
    target = least
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
local registration = redis.call('HMGET', registration_prefix .. target, 'url', 'model', 'tokenizer')
return {target, repinned, registration[1], registration[2], registration[3]}
