-- force_release: free the lock whoever holds it, whatever the count, and hand over.
--
-- KEYS: H, Q, Z, W, F, C (see prelude.lua)
-- ARGV: 1 request id
-- Returns a string: "1" if it was held, "0" if not.
local request_id = ARGV[1]

local hold = redis.call('HMGET', H, 'hr', 'hv')
if hold[1] == request_id then
  return hold[2]
end
local fence = redis.call('HMGET', F, 'r', 'v', 't')
if fence[1] == request_id then
  return fence[2]
end
if redis.call('DEL', H) == 0 then
  return '0'
end
hand_over(request_id, '1', fence[3])
redis.call('HSET', F, 'r', request_id, 'v', '1')
tidy()
return '1'
