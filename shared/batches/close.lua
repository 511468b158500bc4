-- Close a running batch early (cancel): set its status and end its stream, once.
-- KEYS[1] batch hash, KEYS[2] stream
-- ARGV[1] new status, ARGV[2] reason, ARGV[3] now
-- Returns {1, previous} when closed now, {0, current} when it was not running, {0, ""} when absent.
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return {0, ''}
end
if status ~= 'running' then
  return {0, status}
end
finish(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
return {1, status}
