-- release: one level down for the holder with the matching token; at 0, hand over.
--
-- KEYS: H, Q, Z, W, F, C (see prelude.lua)
-- ARGV: 1 owner, 2 token, 3 request id
-- Returns a string: "R <remaining hold count>", or "N" (not held with that token; no change).
local owner, token, request_id = ARGV[1], ARGV[2], ARGV[3]

local replayed = replay(request_id)
if replayed then
  return replayed
end
evict_expired()

if redis.call('HGET', H, 'o') ~= owner or redis.call('HGET', H, 't') ~= token then
  tidy()
  return 'N'
end

local remaining = redis.call('HINCRBY', H, 'c', -1)
if remaining > 0 then
  return remember(request_id, 'R ' .. int(remaining), true)
end

local reply = 'R 0'
redis.call('DEL', H)
hand_over(request_id, reply)
tidy()
return remember(request_id, reply, false)
