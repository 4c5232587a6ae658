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

local replayed = replay(request_id)
if replayed then
  return replayed
end
evict_expired()

if redis.call('HGET', H, 'o') == owner then
  local count
  if redis.call('HGET', H, 'p') == '1' then
    -- Confirming a hand-over: the hold is the one granted, not a second level.
    redis.call('HDEL', H, 'p')
    count = tonumber(redis.call('HGET', H, 'c'))
  else
    count = redis.call('HINCRBY', H, 'c', 1)
  end
  redis.call('PEXPIRE', H, lease)
  dequeue(owner)
  tidy()
  return remember(request_id, 'G ' .. redis.call('HGET', H, 't') .. ' ' .. int(count), true)
end

local held = redis.call('EXISTS', H) == 1
local head_ticket, head_owner = head()
if not held and (not head_ticket or head_owner == owner) then
  dequeue(owner)
  local token = int(next_token())
  redis.call('HSET', H, 'o', owner, 'c', 1, 't', token)
  redis.call('PEXPIRE', H, lease)
  redis.call('HSET', F, 'n', name)
  tidy()
  return remember(request_id, 'G ' .. token .. ' 1', true)
end

if not may_queue then
  tidy()
  return 'B'
end

-- Join, or refresh the deadline and keep the place; a waiter already expired has lost it.
local deadline = now_ms + waiter_ttl
local ticket = redis.call('HGET', W, '@' .. owner)
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
redis.call('ZADD', Z, int(deadline), ticket)
redis.call('HSET', W, '#' .. ticket, int(waiter_ttl) .. ':' .. owner)
redis.call('HSET', F, 'n', name)
expire_queue_keys()

local last_token = redis.call('HGET', F, 't') or '0'
if held and head_owner == owner then
  return 'Q ' .. int(redis.call('PTTL', H)) .. ' ' .. last_token
end
return 'Q -1 ' .. last_token
