-- Shared by fill.lua and record.lua (prepended to both): reserve the next prompts of the batch
-- while fewer than max_in_flight groups run. A reserved group is in flight at once and listed
-- in `launching` until its jobs are confirmed submitted; the sweep re-submits it after a crash.
local function reserve(batch, inflight, launching, group_prefix, now, ttl)
  local reserved = {}
  local max = tonumber(redis.call('HGET', batch, 'max_in_flight'))
  local size = tonumber(redis.call('HGET', batch, 'pool_size'))
  while tonumber(redis.call('HGET', batch, 'in_flight')) < max do
    local cursor = tonumber(redis.call('HGET', batch, 'cursor'))
    if cursor >= size then
      break
    end
    redis.call('HSET', batch, 'cursor', cursor + 1)
    redis.call('HINCRBY', batch, 'in_flight', 1)
    redis.call('HINCRBY', batch, 'launched', 1)
    redis.call('SADD', inflight, cursor)
    redis.call('ZADD', launching, now, cursor)
    local group = group_prefix .. cursor
    redis.call('HSET', group, 'launched_at', now, 'recorded', 0)
    redis.call('EXPIRE', group, ttl)
    reserved[#reserved + 1] = cursor
  end
  if #reserved > 0 then
    -- A set emptied by SREM is deleted, so SADD recreates it: give it the batch's lifetime again.
    redis.call('EXPIRE', inflight, ttl)
    redis.call('EXPIRE', launching, ttl)
  end
  return reserved
end

local function finish(batch, stream, status, reason, now)
  redis.call('HSET', batch, 'status', status, 'finished_at', now, 'reason', reason)
  redis.call('XADD', stream, '*', 'type', 'end', 'status', status)
end
