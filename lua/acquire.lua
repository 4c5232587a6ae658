-- acquire: grant, re-enter, confirm a pending grant, or join/stay in the queue.
--
-- KEYS: H, Q, Z, W, F, C (see prelude.lua)
-- ARGV: 1 owner, 2 lease ms, 3 waiter ttl ms, 4 queue ("1" or "0"), 5 request id, 6 lock name
-- Returns a string:
--   "G <token> <hold count>"  granted (first grant, re-entry or confirmed hand-over)
--   "Q <ms> <last token>"     queued; <ms> = holder's remaining lease if the caller is the
--                             head waiter (re-check then), -1 otherwise; <last token> = the
--                             highest token issued for this lock (0 if none)
--   "B"                       busy, and the request did not ask to queue
local owner, lease, waiter_ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local may_queue, request_id, name = ARGV[4] == '1', ARGV[5], ARGV[6]

local hold = redis.call('HMGET', H, 'o', 'c', 't', 'p', 'hr', 'hv')
if hold[5] == request_id then
  return hold[6]
end

local has_queue = redis.call('LINDEX', Q, 0) ~= false
if has_queue then
  evict_expired()
end

if hold[1] == owner then
  local count = tonumber(hold[2])
  if not count then
    return foreign('has no hold count')
  end
  if hold[4] == '1' then
    -- Confirming a hand-over: the hold is the one granted, not a second level.
    redis.call('HDEL', H, 'p')
  else
    count = count + 1
  end
  local reply = 'G ' .. hold[3] .. ' ' .. int(count)
  redis.call('HSET', H, 'c', int(count), 'hr', request_id, 'hv', reply)
  redis.call('PEXPIRE', H, lease)
  if has_queue then
    dequeue(owner)
    tidy()
  end
  return reply
end

local fence = redis.call('HMGET', F, 't', 'n')
local held = hold[1] ~= false
local head_ticket, head_owner
if has_queue then
  head_ticket, head_owner = head()
end

if not held and (not head_ticket or head_owner == owner) then
  if head_ticket then
    dequeue(owner)
  end
  local token = next_token(fence[1])
  local reply = 'G ' .. token .. ' 1'
  redis.call('HSET', H, 'o', owner, 'c', 1, 't', token, 'hr', request_id, 'hv', reply)
  redis.call('PEXPIRE', H, lease)
  if fence[2] == name then
    redis.call('HSET', F, 't', token)
  else
    redis.call('HSET', F, 't', token, 'n', name)
  end
  tidy()
  return reply
end

if not may_queue then
  tidy()
  return 'B'
end

-- Join, or refresh the deadline and keep the place; a waiter already expired has lost it.
local ticket = has_queue and redis.call('HGET', W, '@' .. owner) or nil
if ticket then
  local current = tonumber(redis.call('ZSCORE', Z, ticket))
  if not current or current <= now_ms then
    drop_ticket(ticket)
    ticket = nil
  end
end
if not ticket then
  ticket = int(redis.call('HINCRBY', F, 's', 1))
  redis.call('RPUSH', Q, ticket)
  redis.call('HSET', W, '@' .. owner, ticket)
  if not head_ticket then
    head_ticket, head_owner = ticket, owner
  end
end
redis.call('ZADD', Z, int(now_ms + waiter_ttl), ticket)
redis.call('HSET', W, '#' .. ticket, int(waiter_ttl) .. ':' .. owner)
if fence[2] ~= name then
  redis.call('HSET', F, 'n', name)
end
expire_queue_keys()
tidy()

local last_token = fence[1] or '0'
if held and head_owner == owner then
  return 'Q ' .. int(redis.call('PTTL', H)) .. ' ' .. last_token
end
return 'Q -1 ' .. last_token
