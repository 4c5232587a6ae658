-- leave_queue: a waiter gives up its place, and gives back a pending grant made to it.
--
-- KEYS: H, Q, Z, W, F, C (see prelude.lua)
-- ARGV: 1 owner, 2 request id
-- Returns "OK". Leaving twice is the same as leaving once, so there is no replay check.
local owner, request_id = ARGV[1], ARGV[2]

if redis.call('LINDEX', Q, 0) then
  evict_expired()
  dequeue(owner)
end
local hold = redis.call('HMGET', H, 'o', 'p')
if hold[1] == owner and hold[2] == '1' then
  redis.call('DEL', H)
  hand_over(request_id, 'OK', redis.call('HGET', F, 't'))
elseif not hold[1] then
  -- The lock is free: the new head may take it now rather than at its next heartbeat.
  local ticket, head_owner = head()
  if ticket then
    redis.call('SPUBLISH', C, 'R ' .. head_owner)
  end
end
tidy()
return 'OK'
