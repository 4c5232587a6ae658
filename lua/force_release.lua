-- force_release: free the lock whoever holds it, whatever the count, and hand over.
--
-- KEYS: H, Q, Z, W, F, C (see prelude.lua)
-- ARGV: 1 request id
-- Returns a string: "1" if it was held, "0" if not.
local request_id = ARGV[1]

local replayed = replay(request_id)
if replayed then
  return replayed
end
evict_expired()

if redis.call('EXISTS', H) == 0 then
  tidy()
  return '0'
end
redis.call('DEL', H)
hand_over(request_id, '1')
tidy()
return remember(request_id, '1', false)
