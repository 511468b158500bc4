-- Put an rq job id back at the head of its queue, if it is still in the intermediate list.
-- KEYS[1]: the queue's intermediate list; KEYS[2]: the queue; ARGV[1]: the rq job id.
-- Returns 1 when moved, 0 when a worker took it out meanwhile.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
    redis.call('LPUSH', KEYS[2], ARGV[1])
    return 1
end
return 0
