-- acquire: grant, re-enter, confirm a pending grant, or join/stay in the queue.
--
-- KEYS: H, Q, Z, W, F, X (see prelude.lua)
-- ARGV: 1 owner, 2 attempt, 3 lease ms, 4 waiter ttl ms, 5 queue ("1" or "0"), 6 lock name,
--       7 resend horizon ms, 8 waker (the caller's process channel, C:<waker>; "" for none),
--       9 channel, 10 fence margin ms
-- Returns a string:
--   "G <token> <hold count>"  the attempt holds a level: first grant, re-entry, confirmed
--                             hand-over, or a level it already had (a re-send: no change)
--   "Q <ms> <last token>"     queued; <ms> = when to ask again if the caller may be the head
--                             waiter (the holder's remaining lease; 0 while dead waiters in
--                             front are still being cleared), -1 otherwise; <last token> =
--                             the highest token issued for this lock (0 if none)
--   "B"                       busy, and the request did not ask to queue; or the attempt is
--                             spent (a late re-send), which changes nothing
local owner, attempt, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local waiter_ttl, may_queue, name = tonumber(ARGV[4]), ARGV[5] == '1', ARGV[6]
horizon_ms = tonumber(ARGV[7])
local waker = ARGV[8]
if not is_waker(waker) then
  return redis.error_reply('ERR fairlock: a waker is up to 32 lowercase hex digits')
end

-- X's type is checked by its read (is_spent), before the first write.
local problem = probe_slot(true)
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
local spent, _
spent, _, problem = is_spent(attempt)
if problem then
  return problem
end

hold = settle(hold, true)
if hold then
  if hold.has_level then
    -- Applied before (a re-sent request, or a reply that was lost): the same grant.
    return 'G ' .. hold.token .. ' ' .. int(count(hold))
  end
  if hold.pending == attempt then
    -- The grantee confirms its hand-over: the pending level becomes a confirmed one.
    hold.pending, hold.pending_until = nil, nil
    hold.confirmed = hold.confirmed + 1
    redis.call('HDEL', H, 'p', 'pd')
    redis.call('HSET', H, 'c', int(hold.confirmed), 'l:' .. attempt, '1')
    lengthen(lease)
    return 'G ' .. hold.token .. ' ' .. int(count(hold))
  end
end

if spent then
  -- Granted before or ended: a request of it that comes late changes nothing.
  return 'B'
end

local has_queue = present[Q]
if hold and hold.owner == owner then
  -- Re-entry: one more level, for this attempt.
  hold.confirmed = hold.confirmed + 1
  redis.call('HSET', H, 'c', int(hold.confirmed), 'l:' .. attempt, '1')
  lengthen(lease)
  if has_queue then
    dequeue(attempt)
    tidy()
  end
  spend(attempt)
  save_spent()
  return 'G ' .. hold.token .. ' ' .. int(count(hold))
end

local head_ticket, head_attempt, head_owner, head_waker, head_record
if has_queue then
  evict_expired()
  local _
  head_ticket, _, head_attempt, head_owner, head_waker, head_record = head()
  if head_unknown then
    -- More dead waiters in front than this call may clear. If the caller is the only live
    -- waiter, or there is none, who is first is known all the same.
    local live = live_waiters()
    local own = live == 1 and redis.call('HGET', W, '@' .. attempt)
    if live == 0 then
      head_unknown = false
    elseif own and tonumber(redis.call('ZSCORE', Z, own) or 0) > now_ms then
      head_unknown = false
      head_ticket, head_attempt, head_owner = own, attempt, owner
    end
  end
end

if not hold and not head_unknown and (not head_ticket or head_attempt == attempt) then
  if head_ticket then
    dequeue(attempt)
  end
  local token = next_token(fence.token)
  redis.call('HSET', H, 'o', owner, 't', token, 'c', 1, 'l:' .. attempt, '1')
  set_lease(lease)
  -- The attempt is spent: F records it with the token (see F in prelude.lua).
  if fence.name == name then
    redis.call('HSET', F, 't', token, grant_record_fields(attempt))
  else
    redis.call('HSET', F, 't', token, 'n', name, grant_record_fields(attempt))
  end
  tidy()
  save_spent()
  return 'G ' .. token .. ' 1'
end

if not hold and head_ticket and head_attempt ~= attempt and front_changed(head_ticket) then
  -- The lock is free and this call cleared the dead in front of the head: tell it now rather
  -- than at its next heartbeat.
  tell(head_waker, 'R ' .. head_owner)
end

if not may_queue then
  tidy()
  return 'B'
end

-- Join, or refresh the deadline and keep the place; an entry already expired has lost it.
-- The head's ticket is known live, and its record names its attempt (whose "@" entry points
-- back at it); any other waiter's is looked up.
local ticket, stored = nil, nil
if head_ticket and head_attempt == attempt then
  ticket, stored = head_ticket, head_record
elseif has_queue then
  ticket = redis.call('HGET', W, '@' .. attempt) or nil
  if ticket then
    local current = tonumber(redis.call('ZSCORE', Z, ticket))
    if not current or current <= now_ms then
      forget(ticket, attempt)
      ticket = nil
    end
  end
end
local new_ticket = not ticket
if new_ticket then
  -- Tickets only grow, also if F was lost (evicted) while the queue lived on.
  local number = redis.call('HINCRBY', F, 's', 1)
  if has_queue then
    local last = queue_last or tonumber(redis.call('ZRANGE', Q, -1, -1, 'WITHSCORES')[2])
    if last and last >= number then
      number = last + 1
      redis.call('HSET', F, 's', int(number))
    end
  end
  ticket = int(number)
  add_to_queue(ticket)
  redis.call('HSET', W, '@' .. attempt, ticket)
  if not head_ticket and not head_unknown then
    head_ticket, head_attempt = ticket, attempt
  end
end
local deadline = now_ms + waiter_ttl
redis.call('ZADD', Z, int(deadline), ticket)
local record = int(waiter_ttl) .. ':' .. attempt .. ':' .. owner
if stored == record and (waker == '' or waker == head_waker) then
  -- The head's heartbeat, its record as it was: nothing to write.
elseif waker == '' then
  redis.call('HSET', W, '#' .. ticket, record)
  if new_ticket then
    -- No waker: told on C. A "$" field of an earlier holder of this ticket number (left by
    -- an older version's scripts, which do not delete it, when F was lost since) must not
    -- send this waiter's wake-ups elsewhere.
    redis.call('HDEL', W, '$' .. ticket)
  end
else
  redis.call('HSET', W, '#' .. ticket, record, '$' .. ticket, waker)
end
if fence.name ~= name then
  redis.call('HSET', F, 'n', name)
end
expire_queue_keys(deadline)
tidy()

-- Without F's token (F was lost: evicted, or a restart without persistence), tokens are
-- floored by the clock (next_token), so every earlier one is below now and every later one
-- above the microsecond before it.
local last_token = fence.token or int(now_us - 1)
if head_unknown and not hold then
  -- Free, but the dead in front are not all cleared: ask again at once to clear more.
  return 'Q 0 ' .. last_token
end
if hold and (head_attempt == attempt or head_unknown) then
  -- When the hold ends: its lease, or sooner when its only level is a pending one.
  local left = math.max(redis.call('PTTL', H), 0)
  hold_ttl = left
  if hold.confirmed == 0 and hold.pending_until then
    left = math.min(left, hold.pending_until - now_ms)
  end
  return 'Q ' .. int(left) .. ' ' .. last_token
end
return 'Q -1 ' .. last_token
