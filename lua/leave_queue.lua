-- leave_queue: a waiter gives up its place, and gives back a pending grant made to it.
--
-- KEYS: H, Q, Z, W, F, C (see prelude.lua)
-- ARGV: 1 owner, 2 request id
-- Returns "OK". Leaving twice is the same as leaving once.
local owner, request_id = ARGV[1], ARGV[2]

evict_expired()
dequeue(owner)
if redis.call('HGET', H, 'o') == owner and redis.call('HGET', H, 'p') == '1' then
  redis.call('DEL', H)
  hand_over(request_id, 'OK')
end
nudge_head()
tidy()
return 'OK'
