-- A stage worker takes a job: move it into the stage, count the attempt, return the record.
-- One round trip instead of read-then-move, and atomic, so the record returned is the one
-- the attempt started from.
--
-- KEYS[1]  the job's hash
-- ARGV[1]  status index key prefix
-- ARGV[2]  job id
-- ARGV[3]  statuses the stage may take the job from, comma separated
-- ARGV[4]  the stage (= the new status)
-- ARGV[5]  now (unix seconds, float)
-- ARGV[6]  the worker's name
--
-- Returns {1, previous_status, attempt, field, value, ...} when taken,
-- {0, current_status} when the job is in another status, {0, ""} when it does not exist.
local key = KEYS[1]
local current = redis.call('HGET', key, 'status')
if not current then
  return {0, ''}
end
local allowed = false
for status in string.gmatch(ARGV[3], '[^,]+') do
  if status == current then
    allowed = true
    break
  end
end
if not allowed then
  return {0, current}
end

local stage = ARGV[4]
local now = ARGV[5]
redis.call('HSET', key, 'status', stage, 'updated_at', now,
  't:' .. stage .. ':started', now, 'worker:' .. stage, ARGV[6])
if current ~= stage then
  redis.call('ZREM', ARGV[1] .. current, ARGV[2])
  redis.call('ZADD', ARGV[1] .. stage, now, ARGV[2])
end
local attempt = redis.call('HINCRBY', key, 'attempts:' .. stage, 1)
local reply = {1, current, attempt}
for _, item in ipairs(redis.call('HGETALL', key)) do
  table.insert(reply, item)
end
return reply
