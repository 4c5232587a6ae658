-- abandon: end an attempt whatever it has: its queue entry, and its level (pending, or
-- granted by a call whose reply never arrived), handing over if that was the last level.
--
-- KEYS: H, Q, Z, W, F, X (see prelude.lua)
-- ARGV: 1 owner, 2 attempt, 3 resend horizon ms, 4 channel, 5 fence margin ms
-- Returns "OK", also when the attempt had nothing (abandoning twice is abandoning once).
local owner, attempt = ARGV[1], ARGV[2]
horizon_ms = tonumber(ARGV[3])

local problem = probe_slot(true) or check_types(X)
if problem then
  return problem
end
local hold, fence
hold, problem = read_hold(attempt)
if problem then
  return problem
end
fence, problem = read_fence()
if problem then
  return problem
end

-- The attempt has ended: a re-sent acquire of it changes nothing. A release that removed its
-- level stays on record.
local _, released = is_spent(attempt)
spend(attempt, released)
drop_grant_record(attempt)

local queued = present[Q] and redis.call('HGET', W, '@' .. attempt)
if queued then
  forget(queued, attempt)
end

hold = settle(hold, true)
local freed = false
if hold and hold.owner == owner and remove_level(hold, attempt) and count(hold) == 0 then
  free_hold()
  hold = nil
  freed = true
end

if freed then
  hand_over(fence.token)
elseif queued and not hold then
  -- The lock is free: if the first in line changed, the new first may take it now rather
  -- than at its next heartbeat.
  evict_expired()
  local ticket, _, _, head_owner, head_waker = head()
  if ticket and front_changed(ticket) then
    tell(head_waker, 'R ' .. head_owner)
  elseif head_unknown and live_waiters() > 0 then
    publish('A')
  end
end
tidy()
save_spent()
return 'OK'
