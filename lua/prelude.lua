-- Shared helpers, prepended to every fairlock script at compile time (see
-- crates/fairlock-redis/src/scripts.rs). They read KEYS/ARGV through the names below, and
-- implement the transitions of the reference backend (crates/fairlock/src/memory.rs).
--
-- One line comes before this prelude: `local PUBLISH = 'SPUBLISH'` (sharded pub/sub, Redis
-- 7.0+ and Valkey) or `local PUBLISH = 'PUBLISH'` (classic, Redis 6.2). Each script is
-- compiled in both variants and the backend runs the one for its server's pub/sub. Every
-- command used here exists in Redis 6.2.
--
-- Keys of one lock, in KEYS order (all share the hash tag, so one Cluster slot):
--   H  hash    the hold: o=owner, t=fencing token, c=number of confirmed levels,
--              "l:<attempt>"="1" for each confirmed level, and while a hand-over is not
--              confirmed p=its attempt (the pending level) and pd=when it lapses (server ms).
--              Hold count = c + 1 while the pending level lives. PEXPIRE = the lease.
--              A pending level whose pd has passed is gone; a hold left without levels is
--              free (scripts delete it when they meet it).
--   Q  list    FIFO of waiter tickets; may hold tombstones of tickets that left (skipped).
--   Z  zset    live tickets -> liveness deadline (server ms).
--   W  hash    "#<ticket>" -> "<ttl ms>:<attempt>:<owner>", "@<attempt>" -> ticket.
--   F  hash    t=last fencing token, s=last ticket, n=lock name. It outlives everything else
--              of the lock by the fence margin, then expires (keep_fence): an idle lock
--              leaves no key.
--   C  channel for wake-ups (a shard channel in sharded mode): "G <token> <attempt> <owner>" (hand-over to that
--      attempt), "R <owner>" (look again). The owner comes last: it may contain spaces.
--   X  zset    spent attempts -> until when they are remembered (server ms): an attempt is
--              spent when it is granted a level (grant, re-entry, hand-over) and when it
--              ends (release, abandon). PEXPIREAT = the latest score, so an idle lock's
--              records vanish by themselves.
--
-- Attempts are 32 lowercase hex digits (fairlock::backend::AttemptId). Re-sent requests need
-- no request ids: an attempt is a level at most once, a release or abandon removes it once,
-- and a spent attempt is never granted again (within the horizon).
--
-- Redis does not roll back a script that fails halfway, so every script checks the keys it
-- touches and the stored values it relies on (check_types, read_hold, read_fence) before its
-- first write; nothing after that can fail on stored data.

local H, Q, Z, W, F, C, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]

-- The server's clock is the only clock: the client sends durations.
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

-- Publishes a wake-up on C with the command the line before the prelude chose. A wake-up that
-- cannot be published (no channel permission in the ACL, a node without sharded pub/sub in a
-- cluster being upgraded) only delays waiters, who heartbeat; so it never fails the script
-- after its writes, which Redis would not roll back.
local function publish(message)
  redis.pcall(PUBLISH, C, message)
end

-- Integers as decimal strings: Lua 5.1 would print large numbers in exponent form.
local function int(n)
  return string.format('%d', n)
end

local function is_digits(text)
  return type(text) == 'string' and string.find(text, '^%d+$') ~= nil and #text <= 16
end

local function is_attempt(text)
  return type(text) == 'string' and #text == 32 and string.find(text, '^[0-9a-f]+$') ~= nil
end

-- The next fencing token after `last` (a stored decimal string, or nil): one past it, and
-- never below the server's clock in microseconds, so tokens keep growing even when the server
-- lost F (restart without persistence).
local function next_token(last)
  return int(math.max((tonumber(last) or 0) + 1, now_us))
end

-- Set when this call changed the queue, so tidy() knows whether to look.
local queue_touched = false

-- A Conflict for the caller: a key of this lock holds data fairlock did not write.
local function foreign(key, detail)
  return redis.error_reply('WRONGTYPE fairlock: ' .. key .. ' ' .. detail)
end

local TYPES = { [H] = 'hash', [Q] = 'list', [Z] = 'zset', [W] = 'hash', [F] = 'hash', [X] = 'zset' }

-- Whether each checked key exists (false: it does not; nil: not checked).
local present = {}

-- Checks that each key is absent or of the type fairlock gives it. Returns an error reply for
-- the first one that is not, else nil. Every script calls it before its first write, for every
-- key it may write or read.
local function check_types(...)
  for _, key in ipairs({ ... }) do
    local found = redis.call('TYPE', key)['ok']
    if found ~= 'none' and found ~= TYPES[key] then
      return foreign(key, 'holds a ' .. found .. ', not a ' .. TYPES[key])
    end
    present[key] = found ~= 'none'
  end
  return nil
end

-- The hold as stored, or nil; and an error reply if H is not one fairlock wrote.
-- Fields: owner, token (string), confirmed (number of confirmed levels), and pending /
-- pending_until while a hand-over is not confirmed.
local function read_hold()
  if present[H] == false then
    return nil, nil
  end
  local f = redis.call('HMGET', H, 'o', 't', 'c', 'p', 'pd')
  if not f[1] then
    if present[H] or redis.call('EXISTS', H) == 1 then
      return nil, foreign(H, 'has no owner')
    end
    return nil, nil
  end
  if not is_digits(f[2]) or not is_digits(f[3]) then
    return nil, foreign(H, 'has no valid token or level count')
  end
  local hold = { owner = f[1], token = f[2], confirmed = tonumber(f[3]) }
  if f[4] then
    if not is_attempt(f[4]) or not is_digits(f[5]) then
      return nil, foreign(H, 'has a malformed pending level')
    end
    hold.pending, hold.pending_until = f[4], tonumber(f[5])
  end
  return hold, nil
end

-- F's fields (token, tickets, name; each may be nil), and an error reply if they are not
-- fairlock's.
local function read_fence()
  if present[F] == false then
    return {}, nil
  end
  local f = redis.call('HMGET', F, 't', 's', 'n')
  if (f[1] and not is_digits(f[1])) or (f[2] and not is_digits(f[2])) then
    return nil, foreign(F, 'has a malformed token or ticket counter')
  end
  return { token = f[1] or nil, tickets = f[2] or nil, name = f[3] or nil }, nil
end

-- The hold count: confirmed levels and the pending one.
local function count(hold)
  return hold.confirmed + (hold.pending and 1 or 0)
end

-- Applies the passage of time to `hold`: a pending level whose deadline has passed is gone,
-- and a hold left without levels is free (nil). With `write`, stores that.
local function settle(hold, write)
  if not hold then
    return nil
  end
  if hold.pending and hold.pending_until <= now_ms then
    hold.pending, hold.pending_until = nil, nil
    if write and hold.confirmed > 0 then
      redis.call('HDEL', H, 'p', 'pd')
    end
  end
  if count(hold) == 0 then
    if write then
      redis.call('DEL', H)
    end
    return nil
  end
  return hold
end

-- Sets the lease to the later of its current end and `lease_ms` from now: never shorter,
-- since another level may rely on it. (PTTL and max: PEXPIRE GT needs Redis 7.)
local function lengthen(lease_ms)
  local left = redis.call('PTTL', H)
  redis.call('PEXPIRE', H, int(math.max(left, lease_ms)))
end

-- Removes the level of `attempt` (pending or confirmed) from `hold`; whether it had one.
-- When no level is left the caller deletes H, so `c` is not updated then.
local function remove_level(hold, attempt)
  if hold.pending == attempt then
    hold.pending, hold.pending_until = nil, nil
    redis.call('HDEL', H, 'p', 'pd')
    return true
  end
  if redis.call('HDEL', H, 'l:' .. attempt) == 1 then
    hold.confirmed = hold.confirmed - 1
    if count(hold) > 0 then
      redis.call('HSET', H, 'c', int(hold.confirmed))
    end
    return true
  end
  return false
end

-- Whether `attempt` is spent: granted a level, released or abandoned, less than the resend
-- horizon ago. A spent attempt is never granted again.
local function is_spent(attempt)
  if present[X] == false then
    return false
  end
  local until_ms = tonumber(redis.call('ZSCORE', X, attempt))
  return until_ms ~= nil and until_ms > now_ms
end

-- How long spent attempts are remembered (ms): set by each script that spends one.
local horizon_ms = nil
-- Attempts this call spent; save_spent() records them in X.
local spent_now = {}

local function spend(attempt)
  table.insert(spent_now, attempt)
end

-- Records the attempts this call spent, until `horizon_ms` from now, in one ZADD. Forgets at
-- most 8 records whose time has passed (bounded work per call), and makes X expire with its
-- latest record. Every script that spends calls it once, on every path, after its changes.
local function save_spent()
  if #spent_now == 0 then
    return
  end
  local until_ms = int(now_ms + horizon_ms)
  local members = {}
  for _, attempt in ipairs(spent_now) do
    table.insert(members, until_ms)
    table.insert(members, attempt)
  end
  spent_now = {}
  redis.call('ZADD', X, unpack(members))
  local expired = redis.call('ZRANGEBYSCORE', X, '-inf', now_ms, 'LIMIT', 0, 8)
  if #expired > 0 then
    redis.call('ZREM', X, unpack(expired))
  end
  local latest = redis.call('ZRANGE', X, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', X, int(tonumber(latest[2])))
end

-- A waiter record: its ttl (ms), attempt and owner; nothing if missing or malformed.
local function waiter_record(ticket)
  local record = redis.call('HGET', W, '#' .. ticket)
  if not record then
    return nil
  end
  local first = string.find(record, ':', 1, true)
  local second = first and string.find(record, ':', first + 1, true)
  local ttl = first and tonumber(string.sub(record, 1, first - 1))
  if not second or not ttl then
    return nil
  end
  return ttl, string.sub(record, first + 1, second - 1), string.sub(record, second + 1)
end

-- Forgets one ticket in O(log n); its list entry becomes a tombstone. `attempt` is its
-- attempt if the caller knows it, `mapped` whether "@<attempt>" is known to point at it.
local function drop_ticket(ticket, attempt, mapped)
  queue_touched = true
  if not attempt then
    local _
    _, attempt = waiter_record(ticket)
  end
  redis.call('ZREM', Z, ticket)
  if attempt and (mapped or redis.call('HGET', W, '@' .. attempt) == ticket) then
    redis.call('HDEL', W, '#' .. ticket, '@' .. attempt)
  else
    redis.call('HDEL', W, '#' .. ticket)
  end
end

-- Removes the queue entry of `attempt`, if it has one.
local function dequeue(attempt)
  local ticket = redis.call('HGET', W, '@' .. attempt)
  if ticket then
    drop_ticket(ticket, attempt, true)
  end
end

-- Evicts a few expired waiters from anywhere in the queue: amortised O(log n) per call.
local function evict_expired()
  local expired = redis.call('ZRANGEBYSCORE', Z, '-inf', now_ms, 'LIMIT', 0, 8)
  for _, ticket in ipairs(expired) do
    drop_ticket(ticket)
  end
end

-- The first live ticket and its ttl, attempt and owner. Tombstones and expired waiters in
-- front of it are popped: each list entry is popped once, so this is amortised O(log n).
local function head()
  while true do
    local ticket = redis.call('LINDEX', Q, 0)
    if not ticket then
      return nil
    end
    local deadline = tonumber(redis.call('ZSCORE', Z, ticket))
    local ttl, attempt, owner
    if deadline and deadline > now_ms then
      ttl, attempt, owner = waiter_record(ticket)
      if ttl then
        return ticket, ttl, attempt, owner
      end
    end
    if deadline then
      drop_ticket(ticket, attempt)
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

-- The lock just became free (H is gone): hand it to the head live waiter as a new hold whose
-- only level is pending, lapsing (with the lease) after the waiter's liveness TTL, spend that
-- attempt, and tell the waiter's owner. `last_token` is F's `t`.
local function hand_over(last_token)
  if present[Q] == false then
    -- No queue when the script started, and the scripts that hand over never add to it.
    return
  end
  evict_expired()
  local ticket, ttl, attempt, owner = head()
  if not ticket then
    return
  end
  -- A live ticket's record names its attempt, whose "@" entry points back at it.
  drop_ticket(ticket, attempt, true)
  redis.call('LPOP', Q)
  local token = next_token(last_token)
  local until_ms = int(now_ms + ttl)
  redis.call('HSET', F, 't', token)
  redis.call('HSET', H, 'o', owner, 't', token, 'c', 0, 'p', attempt, 'pd', until_ms)
  redis.call('PEXPIREAT', H, until_ms)
  spend(attempt)
  publish('G ' .. token .. ' ' .. attempt .. ' ' .. owner)
end

-- F outlives everything of the lock (the hold's lease, the last waiter's deadline) by the
-- fence margin, the last ARGV of every mutating script, then expires: an idle lock leaves no
-- key behind. Tokens still increase after F is gone (next_token: never below the server's
-- clock in microseconds), unless the server's clock steps back by more than the margin.
-- Only a hash of ours is touched, and nothing here can fail on stored data.
local function keep_fence()
  local margin = tonumber(ARGV[#ARGV])
  if not margin or redis.call('TYPE', F).ok ~= 'hash' then
    return
  end
  local live = math.max(redis.call('PTTL', H), 0)
  local last = redis.pcall('ZRANGE', Z, -1, -1, 'WITHSCORES')
  if type(last) == 'table' and not last.err and last[2] then
    live = math.max(live, tonumber(last[2]) - now_ms)
  end
  redis.call('PEXPIRE', F, int(live + margin))
end

-- Every mutating script's reply goes through here (see crates/fairlock-redis/src/scripts.rs):
-- F's expiry follows what the operation did. A refusal (an error reply) wrote nothing.
local function finish(reply)
  if type(reply) == 'table' and reply.err then
    return reply
  end
  keep_fence()
  return reply
end
