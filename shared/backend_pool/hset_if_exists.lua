-- HSET on a hash that still exists (a backend's record, which its deregistration may have removed).
-- KEYS[1]: the hash; ARGV: field, value, field, value, ...; returns 1 when set, 0 when the hash is gone.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
