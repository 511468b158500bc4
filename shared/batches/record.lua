-- Record one job of a batch group reaching a terminal status. When that completes the group:
-- decide its outcome, count it, report it on the stream, and either reserve the next prompts
-- (asynchronous replenishment) or close the batch. Atomic, so two jobs of different groups
-- ending at once never both take the last slot, and a job recorded twice counts once.
--
-- KEYS[1] batch hash  KEYS[2] group hash  KEYS[3] inflight set  KEYS[4] launching zset
-- KEYS[5] stream      KEYS[6] live set
-- ARGV[1] group key prefix  ARGV[2] prompt index  ARGV[3] sample index  ARGV[4] job id
-- ARGV[5] job status        ARGV[6] reward ("" when none)  ARGV[7] now  ARGV[8] ttl (s)
-- ARGV[9] batch id          ARGV[10] error message ("" when none)
--
-- Returns {0, why} when nothing was recorded (no such batch, duplicate), {1} when the sample
-- was recorded and its group is still running, or {2, outcome, batch status, reserved, late}
-- when the group completed; `reserved` lists the prompt indices the caller must now launch,
-- `late` is 1 when the batch had already closed (the group is counted, not reported).
local batch, group, inflight, launching, stream, live = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local k, sample, now = ARGV[2], ARGV[3], ARGV[7]
if redis.call('EXISTS', batch) == 0 then
  return {0, 'no-batch'}
end
if redis.call('HGET', group, 'outcome') then
  return {0, 'complete'}
end
if redis.call('HSETNX', group, 's:' .. sample, ARGV[5]) == 0 then
  return {0, 'duplicate'}
end
redis.call('HSET', group, 'j:' .. sample, ARGV[4], 'r:' .. sample, ARGV[6])
if ARGV[10] ~= '' then
  redis.call('HSETNX', group, 'error', ARGV[10])
end
local n = tonumber(redis.call('HGET', batch, 'n'))
if redis.call('HINCRBY', group, 'recorded', 1) < n then
  return {1}
end

-- The group is complete. Any sample without a reward makes it `failed`; else any sample sampled by
-- weights too old for the batch's max_staleness (recorded as status `stale`) makes it `stale`.
local outcome = 'informative'
local lo, hi = nil, nil
local stale = false
for s = 0, n - 1 do
  local reward = tonumber(redis.call('HGET', group, 'r:' .. s))
  local sample_status = redis.call('HGET', group, 's:' .. s)
  if sample_status == 'stale' then
    stale = true
  elseif sample_status ~= 'done' or reward == nil then
    outcome = 'failed'
  elseif outcome ~= 'failed' then
    if lo == nil or reward < lo then lo = reward end
    if hi == nil or reward > hi then hi = reward end
  end
end
if outcome ~= 'failed' and stale then
  outcome = 'stale'
elseif outcome ~= 'failed' and hi - lo <= tonumber(redis.call('HGET', batch, 'epsilon')) then
  outcome = 'uniform'
end
redis.call('HSET', group, 'outcome', outcome, 'completed_at', now)
if redis.call('SREM', inflight, k) == 1 then
  redis.call('HINCRBY', batch, 'in_flight', -1)
end
redis.call('ZREM', launching, k)
redis.call('HINCRBY', batch, 'completed', 1)

local status = redis.call('HGET', batch, 'status')
if status ~= 'running' then
  -- Finished after the batch closed (target met, cancelled): counted, never reported.
  redis.call('HSET', group, 'late', 1)
  redis.call('HINCRBY', batch, 'late', 1)
  if tonumber(redis.call('HGET', batch, 'in_flight')) <= 0 then
    redis.call('SREM', live, ARGV[9])
  end
  return {2, outcome, status, {}, 1}
end

redis.call('HINCRBY', batch, outcome, 1)
local used = outcome == 'informative' or (outcome ~= 'stale' and redis.call('HGET', batch, 'mode') == 'all')
if used then
  redis.call('HSET', group, 'used', 1)
  redis.call('HINCRBY', batch, 'used', 1)
end
if used or outcome == 'failed' then
  redis.call('XADD', stream, '*', 'type', 'group', 'k', k)
end

local reserved = {}
if tonumber(redis.call('HGET', batch, 'used')) >= tonumber(redis.call('HGET', batch, 'target')) then
  finish(batch, stream, 'completed', 'target', now)
else
  reserved = reserve(batch, inflight, launching, ARGV[1], now, tonumber(ARGV[8]))
  if tonumber(redis.call('HGET', batch, 'in_flight')) <= 0 then
    -- Nothing left to run and the target is not met: the prompts ran out.
    finish(batch, stream, 'exhausted', 'pool exhausted', now)
  end
end
status = redis.call('HGET', batch, 'status')
if status ~= 'running' and tonumber(redis.call('HGET', batch, 'in_flight')) <= 0 then
  redis.call('SREM', live, ARGV[9])
end
return {2, outcome, status, reserved, 0}
