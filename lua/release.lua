-- release: one level down for the holder with the matching token; at 0, hand over.
--
-- KEYS: H, Q, Z, W, F, C (see prelude.lua)
-- ARGV: 1 owner, 2 token, 3 request id
-- Returns a string: "R <remaining hold count>", or "N" (not held with that token; no change).
local owner, token, request_id = ARGV[1], ARGV[2], ARGV[3]

local hold = redis.call('HMGET', H, 'o', 'c', 't', 'hr', 'hv')
if hold[4] == request_id then
  return hold[5]
end
local fence = redis.call('HMGET', F, 'r', 'v', 't')
if fence[1] == request_id then
  return fence[2]
end
if hold[1] ~= owner or hold[3] ~= token then
  return 'N'
end
local count = tonumber(hold[2])
if not count then
  return foreign('has no hold count')
end

if count > 1 then
  local reply = 'R ' .. int(count - 1)
  redis.call('HSET', H, 'c', int(count - 1), 'hr', request_id, 'hv', reply)
  return reply
end

local reply = 'R 0'
redis.call('DEL', H)
hand_over(request_id, reply, fence[3])
redis.call('HSET', F, 'r', request_id, 'v', reply)
tidy()
return reply
