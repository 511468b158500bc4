-- Move one job to a new status if, and only if, its current status is allowed.
-- Atomic, so a cancel and a stage hand-over can never both win.
--
-- KEYS[1]  the job's hash
-- ARGV[1]  status index key prefix (the status name is appended)
-- ARGV[2]  job id
-- ARGV[3]  allowed current statuses, comma separated ("*" = any non-terminal)
-- ARGV[4]  new status
-- ARGV[5]  now (unix seconds, float)
-- ARGV[6]  seconds to keep the record once terminal, or 0 when the new status is not terminal
-- ARGV[7]  channel to publish the change on ("" for none)
-- ARGV[8]  guard field ("" for none): the move applies only if this field ...
-- ARGV[9]  ... holds this value (a stage attempt's fencing token)
-- ARGV[10..] extra field, value pairs to set together with the status
--
-- Returns {1, previous_status} when applied, {0, current_status} when refused,
-- {0, "superseded"} when the guard does not hold, {0, ""} when the job does not exist.
local key = KEYS[1]
local current = redis.call('HGET', key, 'status')
if not current then
  return {0, ''}
end

local terminal = {done = true, failed = true, cancelled = true, timed_out = true}
local allowed = false
if ARGV[3] == '*' then
  allowed = not terminal[current]
else
  for status in string.gmatch(ARGV[3], '[^,]+') do
    if status == current then
      allowed = true
      break
    end
  end
end
if not allowed then
  return {0, current}
end
if ARGV[8] ~= '' and redis.call('HGET', key, ARGV[8]) ~= ARGV[9] then
  return {0, 'superseded'}
end

local new_status = ARGV[4]
local now = ARGV[5]
redis.call('HSET', key, 'status', new_status, 'updated_at', now)
for i = 10, #ARGV, 2 do
  redis.call('HSET', key, ARGV[i], ARGV[i + 1])
end
if current ~= new_status then
  redis.call('ZREM', ARGV[1] .. current, ARGV[2])
  redis.call('ZADD', ARGV[1] .. new_status, now, ARGV[2])
end
local ttl = tonumber(ARGV[6])
if ttl and ttl > 0 then
  redis.call('EXPIRE', key, ttl)
end
if ARGV[7] ~= '' then
  redis.call('PUBLISH', ARGV[7], ARGV[2] .. ' ' .. new_status)
end
return {1, current}
