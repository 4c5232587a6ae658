-- Shared helpers, prepended to every fairlock script at compile time (see
-- crates/fairlock-redis/src/scripts.rs). They read KEYS/ARGV through the names below.
--
-- Keys of one lock (all share the hash tag, so one Cluster slot):
--   H  hash    the holder: o=owner, c=hold count, t=token, p="1" while a pending grant,
--              hr/hv = last request id applied to this hold and its reply (a re-sent
--              request with that id gets the reply again, not a second effect).
--              PEXPIRE = lease.
--   Q  list    FIFO of waiter tickets; may hold tombstones of tickets that left (skipped).
--   Z  zset    live tickets -> liveness deadline (server ms).
--   W  hash    "#<ticket>" -> "<ttl ms>:<owner>", "@<owner>" -> ticket.
--   F  hash    never deleted: t=last fencing token, s=last ticket, n=lock name,
--              r/v = the last request that freed the lock (release, force release) and its
--              reply, for when it is re-sent after H is gone.
--   C  shard channel for wake-ups: "G <token> <owner>" (hand-over), "R <owner>" (recheck).

local H, Q, Z, W, F, C = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

-- The server's clock is the only clock: the client sends durations.
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

-- Integers as decimal strings: Lua 5.1 would print large numbers in exponent form.
local function int(n)
  return string.format('%d', n)
end

-- The next fencing token after `last` (a stored decimal string, or nil): one past it, and
-- never below the server's clock in microseconds, so tokens keep growing even when the server
-- lost F (restart without persistence).
local function next_token(last)
  return int(math.max((tonumber(last) or 0) + 1, now_us))
end

-- Set when this call changed the queue, so tidy() knows whether to look.
local queue_touched = false

-- Stops with a Conflict for the caller when a holder hash is not one fairlock wrote.
local function foreign(detail)
  return redis.error_reply('WRONGTYPE fairlock: ' .. H .. ' ' .. detail)
end

local function waiter_record(ticket)
  local record = redis.call('HGET', W, '#' .. ticket)
  if not record then
    return nil, nil
  end
  local colon = string.find(record, ':', 1, true)
  if not colon then
    return nil, nil
  end
  return tonumber(string.sub(record, 1, colon - 1)), string.sub(record, colon + 1)
end

-- Forgets one ticket in O(log n); its list entry becomes a tombstone.
local function drop_ticket(ticket)
  queue_touched = true
  local _, owner = waiter_record(ticket)
  redis.call('ZREM', Z, ticket)
  redis.call('HDEL', W, '#' .. ticket)
  if owner and redis.call('HGET', W, '@' .. owner) == ticket then
    redis.call('HDEL', W, '@' .. owner)
  end
end

local function dequeue(owner)
  local ticket = redis.call('HGET', W, '@' .. owner)
  if ticket then
    drop_ticket(ticket)
  end
end

-- Evicts a few expired waiters from anywhere in the queue: amortised O(log n) per call.
local function evict_expired()
  local expired = redis.call('ZRANGEBYSCORE', Z, '-inf', now_ms, 'LIMIT', 0, 8)
  for _, ticket in ipairs(expired) do
    drop_ticket(ticket)
  end
end

-- The first live ticket and its owner. Tombstones and expired waiters in front of it are
-- popped: each list entry is popped once, so this is amortised O(log n).
local function head()
  while true do
    local ticket = redis.call('LINDEX', Q, 0)
    if not ticket then
      return nil, nil
    end
    local deadline = tonumber(redis.call('ZSCORE', Z, ticket))
    if deadline and deadline > now_ms then
      local ttl, owner = waiter_record(ticket)
      if ttl then
        return ticket, owner
      end
    end
    if deadline then
      drop_ticket(ticket)
    end
    queue_touched = true
    redis.call('LPOP', Q)
  end
end

-- Queue keys disappear by themselves when the last waiter's deadline passes.
local function expire_queue_keys()
  local last = redis.call('ZRANGE', Z, -1, -1, 'WITHSCORES')
  if last[2] then
    local at = int(tonumber(last[2]))
    redis.call('PEXPIREAT', Q, at)
    redis.call('PEXPIREAT', Z, at)
    redis.call('PEXPIREAT', W, at)
  end
end

-- Nothing left behind: without live waiters the list only holds tombstones.
local function tidy()
  if queue_touched and redis.call('ZCARD', Z) == 0 then
    redis.call('DEL', Q, W)
  end
end

-- The lock just became free: hand it to the head live waiter as a pending grant that lasts
-- the waiter's liveness TTL, and tell that waiter. `last_token` is F's `t`; the new hold
-- remembers the request that made it, so a re-sent one is recognised.
local function hand_over(request_id, reply, last_token)
  if not redis.call('LINDEX', Q, 0) then
    return
  end
  evict_expired()
  local ticket, owner = head()
  if not ticket then
    return
  end
  local ttl = waiter_record(ticket)
  drop_ticket(ticket)
  redis.call('LPOP', Q)
  local token = next_token(last_token)
  redis.call('HSET', F, 't', token)
  redis.call('HSET', H, 'o', owner, 'c', 1, 't', token, 'p', '1', 'hr', request_id, 'hv', reply)
  redis.call('PEXPIRE', H, int(ttl))
  redis.call('SPUBLISH', C, 'G ' .. token .. ' ' .. owner)
end
