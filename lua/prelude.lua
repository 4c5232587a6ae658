-- Shared helpers, prepended to every fairlock script (see crates/fairlock-redis/src/scripts.rs).
-- They read KEYS/ARGV through the names below, and implement the transitions of the reference
-- backend (crates/fairlock/src/memory.rs).
--
-- One line comes before this prelude: `local PUBLISH = 'SPUBLISH'` (sharded pub/sub, Redis
-- 7.0+ and Valkey) or `local PUBLISH = 'PUBLISH'` (classic, Redis 6.2). Each script is
-- built in both variants and the backend runs the one for its server's pub/sub. Every
-- command used here exists in Redis 6.2. Each operation's file is the body of a function;
-- a call runs begin() with its arguments, then the operation. As an EVAL script, the prelude
-- and one operation run anew on every call; on Redis 7 the sharded variant is also one
-- Function library (the prelude once, every operation registered as a function), loaded once
-- per server, so the prelude's functions are not rebuilt on every call.
--
-- Keys of one lock, in KEYS order (all share the hash tag, so one Cluster slot):
--   H  hash    the hold: o=owner, t=fencing token, c=number of confirmed levels,
--              "l:<attempt>"="1" for each confirmed level, and while a hand-over is not
--              confirmed p=its attempt (the pending level) and pd=when it lapses (server ms).
--              Hold count = c + 1 while the pending level lives. PEXPIRE = the lease.
--              A pending level whose pd has passed is gone; a hold left without levels is
--              free (scripts delete it when they meet it).
--   Q  zset    the FIFO: queued tickets, each scored by its own number (tickets only grow,
--              so the lowest is first in line). Leaving removes the entry: no tombstones.
--   Z  zset    the same tickets -> liveness deadline (server ms). A ticket whose deadline
--              has passed is dead; calls evict a bounded number of them (see DROP_BUDGET).
--   W  hash    "#<ticket>" -> "<ttl ms>:<attempt>:<owner>", "@<attempt>" -> ticket, and
--              "$<ticket>" -> the waker: which process's channel (C:<waker>) tells this waiter.
--              A record without one (queued by a version before these channels) is told on C.
--   F  hash    t=last fencing token, s=last ticket, n=lock name; and g=the attempt the last
--              new hold was granted to (a grant of the free lock, or a hand-over), gu=until
--              when it is spent (server ms): its record, kept here rather than in X, since
--              those grants write F anyway (X's commands were a third of an uncontended
--              acquire's server time). A release or abandon of that attempt records it in X
--              (as it would anyway) and deletes g, unless its hand-over writes a new one; a
--              force release moves g to X. A grant to another attempt while g is still live
--              (its hold lapsed) moves it to X first. F outlives everything else of the lock
--              by the fence margin, and g until gu, then expires (keep_fence): an idle lock
--              leaves no key.
--   C  channel for wake-ups (a shard channel in sharded mode): "A" (every waiter: look again).
--      C:<waker> is the channel of one process (one backend's subscriber): "G <token> <attempt>
--      <owner>" (hand-over to that attempt), "R <owner>" (look again) go to the waiter's
--      process alone, so a hand-over does not wake every process waiting for the lock. The
--      owner comes last: it may contain spaces. Not keys: C is passed as the second-to-last
--      ARGV, so a slot migration does not count it as a missing key; C:<waker> shares its hash
--      tag, so its slot.
--   X  zset    spent attempts -> until when they are remembered (server ms): an attempt is
--              spent when it is granted a level (grant, re-entry, hand-over) and when it
--              ends (release, abandon); a grant of a new hold is recorded in F instead (g),
--              until it moves here. The score has a half (until + 0.5) once a release
--              removed the attempt's level, so that release sent again answers as it did,
--              not as a lost lease. PEXPIREAT = the latest score, so an idle lock's records
--              vanish by themselves. Also "f:<token>" for a hold a force release freed, so
--              that request sent again answers as it did (attempts have no colon).
--
-- Attempts are 32 lowercase hex digits (fairlock::backend::AttemptId). Re-sent requests need
-- no request ids: an attempt is a level at most once, a release or abandon removes it once,
-- and a spent attempt is never granted again (within the horizon).
--
-- Redis does not roll back a script that fails halfway, so every script checks the keys it
-- touches and the stored values it relies on (probe_slot, check_types, read_hold, read_fence)
-- before its first write; nothing after that can fail on stored data.

-- The state of one call. As an EVALSHA script the prelude runs anew on every call; as a Redis
-- Function library (Redis 7) it runs once, when loaded, and every call of its functions shares
-- these locals. So begin() sets every one of them first thing in each call, and nothing
-- carries over from one call to the next (Redis runs one call at a time).
local KEYS, ARGV, H, Q, Z, W, F, X, C, TYPES
-- The server's clock is the only clock: the client sends durations.
local now_ms, now_us
-- Set when this call changed the queue, so tidy() knows whether to look.
local queue_touched
-- Whether each checked key exists (false: it does not; nil: not checked).
local present
-- H's time to live (ms) as this call set or read it: keep_fence then need not ask.
local hold_ttl
-- How long spent attempts are remembered (ms): set by each script that spends one.
local horizon_ms
-- Attempts this call spent; save_spent() records them in X.
local spent_now
-- Queue entries this call dropped (see DROP_BUDGET), and the lowest ticket among them: tickets
-- are ordered, so a head above it means the front of the queue changed in this call (see
-- front_changed).
local dropped, lowest_dropped
-- Set by head() when the budget ran out before it found a live waiter: who is first in line
-- is not known yet, only that the dead in front of them are being cleared.
local head_unknown
-- The latest waiter deadline (server ms), once this call has read it: keep_fence then need
-- not read it again.
local latest_deadline
-- What this call saw when it read all of Q at once (see saw_queue): Q's last ticket and Z's
-- latest deadline (0 for an empty queue), or nil. Removals since only lower either, so they
-- stay upper bounds, which is all their readers need.
local queue_last, queue_latest
-- Set when this call deleted the queue keys (drop_queue): nothing of them is left to read.
local queue_gone
-- What head() learned, so that tidy() need not count live waiters: how many tickets Q holds,
-- once head() saw all of them (nil: not known), kept up to date by this call's changes; and
-- a live ticket other than the head, while this call has not removed it (nil: none known).
local queue_left, other_live
-- F's grant record (g, gu) as this call read or left it (nil: none, or not read); whether F
-- still has a record this call took out of it (save_spent deletes it, unless a grant of this
-- call replaced it); and records moved out of it to X, which must not overwrite a record X
-- has of the same attempt (a release recorded since).
local grant_record, grant_until, grant_stale
local spent_kept
-- The front of the queue as probe_slot read it, before the call's first write: Q's first
-- tickets, their deadlines, and the waiter records read (ticket -> HMGET of "#" and "$").
-- head() starts from it; any change to the queue drops it (nil: read afresh).
local front

-- Starts a call whose arguments are `input`. The six keys come first, and no key is declared
-- (see crates/fairlock-redis/src/scripts.rs: a declared key that is missing during a Cluster
-- slot migration draws an ASK redirection, which fred does not follow correctly). The call is
-- sent to the node that serves the keys' slot; the probe below refuses it anywhere else.
-- After begin(), KEYS and ARGV are the keys and the operation's arguments, as if the keys had
-- been declared.
local function begin(input)
  KEYS = { input[1], input[2], input[3], input[4], input[5], input[6] }
  ARGV = { unpack(input, 7) }
  H, Q, Z, W, F, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
  -- Mutating scripts end their ARGV with: channel, fence margin (ms).
  C = ARGV[#ARGV - 1]
  TYPES = { [H] = 'hash', [Q] = 'zset', [Z] = 'zset', [W] = 'hash', [F] = 'hash', [X] = 'zset' }
  local clock = redis.call('TIME')
  now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  queue_touched = false
  present = {}
  hold_ttl = nil
  horizon_ms = nil
  spent_now = {}
  dropped, lowest_dropped = 0, nil
  head_unknown = false
  latest_deadline = nil
  queue_last, queue_latest = nil, nil
  queue_gone = false
  queue_left, other_live = nil, nil
  grant_record, grant_until, grant_stale = nil, nil, false
  spent_kept = {}
  front = nil
end

-- Redis Cluster refuses any command of a script on a key of a slot the node does not serve,
-- and, on the node a slot is migrating away from, on a key it does not hold (moved already,
-- or deleted by this very script), with an error that stops the script where it stands; Redis
-- would not roll back the writes before it. Such an error becomes a TRYAGAIN reply, which the
-- backend retries after refreshing its slot map; any other error (an ACL's NOPERM) is
-- returned as it is.
local function cluster_refusal(reply)
  if type(reply) == 'table' and reply.err then
    local text = string.lower(reply.err)
    -- "... non local key in a cluster node", and since Redis 7.4 "... during rehashing of the
    -- slot" (a multi-key command, such as probe_slot's EXISTS, in a slot being migrated) and
    -- "... a slot not served".
    if string.find(text, 'cluster', 1, true) or string.find(text, 'slot', 1, true) then
      return redis.error_reply('TRYAGAIN fairlock: this node does not hold the lock\'s slot now')
    end
    return reply
  end
  return nil
end

-- Redis 7.0 and later, where the sharded variant runs, know PEXPIREAT's GT option.
local HAS_EXPIRE_GT = PUBLISH == 'SPUBLISH'

-- Publishes a wake-up on C with the command the line before the prelude chose. A wake-up that
-- cannot be published (no channel permission in the ACL, a node without sharded pub/sub in a
-- cluster being upgraded) only delays waiters, who heartbeat; so it never fails the script
-- after its writes, which Redis would not roll back.
local function publish(message)
  redis.pcall(PUBLISH, C, message)
end

-- Publishes a wake-up for one waiter: on its process's channel, or on C when its record names
-- none.
local function tell(waker, message)
  redis.pcall(PUBLISH, waker and (C .. ':' .. waker) or C, message)
end

-- A waker as acquire receives it: up to 32 lowercase hex digits, or "" for none.
local function is_waker(text)
  return type(text) == 'string' and #text <= 32 and string.find(text, '^[0-9a-f]*$') ~= nil
end

-- Integers as decimal strings: Lua 5.1 would print large numbers in exponent form.
local function int(n)
  return string.format('%d', n)
end

-- A decimal integer as fairlock writes it (int): no sign, no leading zero, at most 16 digits.
-- Stricter than tonumber, as strict as Redis's own integer parsing (HINCRBY).
local function is_digits(text)
  return type(text) == 'string' and #text <= 16
    and (text == '0' or string.find(text, '^[1-9]%d*$') ~= nil)
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

-- A Conflict for the caller: a key of this lock holds data fairlock did not write.
local function foreign(key, detail)
  return redis.error_reply('WRONGTYPE fairlock: ' .. key .. ' ' .. detail)
end

-- Checks that each key is absent or of the type fairlock gives it. Returns an error reply for
-- the first one that is not, else nil. Every script calls it (or probe_slot) before its first
-- write, for every key it may write or read but H and F, which their reads check (read_hold,
-- read_fence).
local function check_types(...)
  for _, key in ipairs({ ... }) do
    local reply = redis.pcall('TYPE', key)
    local refused = cluster_refusal(reply)
    if refused then
      return refused
    end
    local found = reply['ok']
    if found ~= 'none' and found ~= TYPES[key] then
      return foreign(key, 'holds a ' .. found .. ', not a ' .. TYPES[key])
    end
    present[key] = found ~= 'none'
  end
  return nil
end

-- How many tickets head() reads first (the head is usually live; a short queue is read whole).
local FRONT = 8

-- Notes what a read of all of Q (`tickets`, with their deadlines in Z) shows: Q's last ticket
-- and Z's latest deadline (Z holds the same tickets as Q), so that joins and keep_fence need
-- not read them again.
local function saw_queue(tickets, deadlines)
  queue_last, queue_latest = 0, 0
  for i, ticket in ipairs(tickets) do
    queue_last = math.max(queue_last, tonumber(ticket) or 0)
    queue_latest = math.max(queue_latest, tonumber(deadlines[i]) or 0)
  end
end

-- The error reply of a pcall read that is also `key`'s type check: foreign data (another
-- type), or a Cluster refusal (TRYAGAIN).
local function read_refusal(key, reply)
  if string.find(reply.err, 'WRONGTYPE', 1, true) then
    return foreign(key, 'is not a ' .. TYPES[key])
  end
  return cluster_refusal(reply)
end

-- Reads the front of the queue that head() would read first (Q's first tickets, their
-- deadlines, the first live one's record), through pcall: these reads are also the type
-- checks of Q, Z and W, where they read them (a key they do not reach gets a TYPE). Called
-- before the first write, so head() reads nothing twice. Returns an error reply, or nil.
local function read_front()
  local tickets = redis.pcall('ZRANGE', Q, 0, FRONT - 1)
  if tickets.err then
    return read_refusal(Q, tickets)
  end
  -- A sorted set is never empty: no ticket, no Q.
  present[Q] = #tickets > 0
  if #tickets == 0 then
    return check_types(Z, W)
  end
  local deadlines = redis.pcall('ZMSCORE', Z, unpack(tickets))
  if deadlines.err then
    return read_refusal(Z, deadlines)
  end
  front = { tickets = tickets, deadlines = deadlines, records = {} }
  if #tickets < FRONT then
    saw_queue(tickets, deadlines)
  end
  for i, ticket in ipairs(tickets) do
    local deadline = tonumber(deadlines[i])
    if deadline and deadline > now_ms then
      local fields = redis.pcall('HMGET', W, '#' .. ticket, '$' .. ticket)
      if fields.err then
        return read_refusal(W, fields)
      end
      front.records[ticket] = fields
      return nil
    end
  end
  return check_types(W)
end

-- Every script that may delete a key and touch it again first touches a key of the lock's slot
-- that fairlock never writes (H .. '~'): that fails exactly where the node does not serve the
-- slot or is migrating it away, so the script refuses before any write. `extend` needs no
-- probe: it touches only H, which its first command checks.
-- The keys a script may touch that are usually absent when it is called (the queue keys,
-- and H when `with_hold`: an uncontended acquire has no hold, a lock without waiters no queue
-- keys) are counted in the same EXISTS, H once and every other key twice, H .. '~' too (a key
-- there, someone else's, must not read as the hold being absent): the count's parity tells
-- whether H exists, and its half whether any queue key does. A key known absent needs no
-- TYPE. Those present are checked by their reads before the first write: H by read_hold,
-- the queue keys by read_front, which reads the front of the queue.
local function probe_slot(with_hold)
  local probe = H .. '~'
  local reply
  if with_hold then
    reply = redis.pcall('EXISTS', probe, probe, H, Q, Q, Z, Z, W, W)
  else
    reply = redis.pcall('EXISTS', probe, probe, Q, Q, Z, Z, W, W)
  end
  local refused = cluster_refusal(reply)
  if refused then
    return refused
  end
  if with_hold and reply % 2 == 0 then
    present[H] = false
  end
  if reply < 2 then
    present[Q], present[Z], present[W] = false, false, false
    return nil
  end
  return read_front()
end

-- HMGET of `key`'s fields through pcall, so that the read is also the key's type check: the
-- values, or nil and an error reply (another type: foreign data; a Cluster refusal: TRYAGAIN).
local function read_hash(key, ...)
  local f = redis.pcall('HMGET', key, ...)
  if f.err then
    return nil, read_refusal(key, f)
  end
  return f, nil
end

-- The hold as stored, or nil; and an error reply if H is not one fairlock wrote.
-- Fields: owner, token (string), confirmed (number of confirmed levels), pending /
-- pending_until while a hand-over is not confirmed, and, given an `attempt`, has_level:
-- whether that attempt has a confirmed level (read with the rest: one command).
-- Unless probe_slot found H absent, this read is also H's type check: every script that
-- touches H calls it before its first write, and none TYPEs H.
local function read_hold(attempt)
  if present[H] == false then
    return nil, nil
  end
  local f, problem
  if attempt then
    f, problem = read_hash(H, 'o', 't', 'c', 'p', 'pd', 'l:' .. attempt)
  else
    f, problem = read_hash(H, 'o', 't', 'c', 'p', 'pd')
  end
  if problem then
    return nil, problem
  end
  if not f[1] then
    if redis.call('EXISTS', H) == 1 then
      return nil, foreign(H, 'has no owner')
    end
    present[H] = false
    return nil, nil
  end
  present[H] = true
  if not is_digits(f[2]) or not is_digits(f[3]) then
    return nil, foreign(H, 'has no valid token or level count')
  end
  local hold = {
    owner = f[1],
    token = f[2],
    confirmed = tonumber(f[3]),
    has_level = f[6] and true,
  }
  if hold.has_level and hold.confirmed < 1 then
    -- remove_level would count it below zero and free a hold that still has a level.
    return nil, foreign(H, 'has a level its count does not include')
  end
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
-- Unless check_types saw F, this read is also F's type check, before the script's first
-- write: scripts that read F do not TYPE it.
local function read_fence()
  if present[F] == false then
    return {}, nil
  end
  local f, problem = read_hash(F, 't', 's', 'n', 'g', 'gu')
  if problem then
    return nil, problem
  end
  present[F] = (f[1] or f[2] or f[3] or f[4]) and true or false
  if (f[1] and not is_digits(f[1])) or (f[2] and not is_digits(f[2])) then
    return nil, foreign(F, 'has a malformed token or ticket counter')
  end
  if f[4] then
    if not is_attempt(f[4]) or not is_digits(f[5]) then
      return nil, foreign(F, 'has a malformed grant record')
    end
    grant_record, grant_until = f[4], tonumber(f[5])
  end
  return { token = f[1] or nil, tickets = f[2] or nil, name = f[3] or nil }, nil
end

-- The hold count: confirmed levels and the pending one.
local function count(hold)
  return hold.confirmed + (hold.pending and 1 or 0)
end

-- Deletes the hold (its last level is gone).
local function free_hold()
  redis.call('DEL', H)
  hold_ttl = 0
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
      free_hold()
    end
    return nil
  end
  return hold
end

-- Sets H's lease to `lease_ms` from now and remembers it.
local function set_lease(lease_ms)
  redis.call('PEXPIRE', H, int(lease_ms))
  hold_ttl = lease_ms
end

-- Sets the lease to the later of its current end and `lease_ms` from now: never shorter,
-- since another level may rely on it. (PTTL and max: PEXPIRE GT needs Redis 7.)
local function lengthen(lease_ms)
  local left = redis.call('PTTL', H)
  set_lease(math.max(left, lease_ms))
end

-- Removes the level of `attempt` (pending or confirmed) from `hold`, which read_hold(attempt)
-- read; whether it had one. When no level is left the caller deletes H, so H's fields are
-- not updated then.
local function remove_level(hold, attempt)
  if hold.pending == attempt then
    hold.pending, hold.pending_until = nil, nil
    if count(hold) > 0 then
      redis.call('HDEL', H, 'p', 'pd')
    end
    return true
  end
  if hold.has_level then
    hold.has_level = false
    hold.confirmed = hold.confirmed - 1
    if count(hold) > 0 then
      redis.call('HDEL', H, 'l:' .. attempt)
      redis.call('HSET', H, 'c', int(hold.confirmed))
    end
    return true
  end
  return false
end

-- Whether `attempt` is spent: granted a level, released or abandoned, less than the resend
-- horizon ago (a spent attempt is never granted again); and whether a release removed its
-- level (the score's half). Its record is in X, or in F (read_fence read it). Where no TYPE
-- checked X before (acquire), this read is X's type check, before the first write: a third
-- value is then the error reply for X holding something else.
local function is_spent(attempt)
  local score
  if present[X] ~= false then
    local reply = redis.pcall('ZSCORE', X, attempt)
    if type(reply) == 'table' and reply.err then
      return false, false, read_refusal(X, reply)
    end
    score = tonumber(reply)
    if score then
      present[X] = true
    end
  end
  -- The record lasts until its whole milliseconds, the mark aside.
  if score and math.floor(score) > now_ms then
    return true, score % 1 ~= 0, nil
  end
  if attempt == grant_record and grant_until > now_ms then
    return true, false, nil
  end
  return false, false, nil
end

-- Records `attempt` as spent (save_spent); `released`: a release removed its level, now or
-- before (a record keeps it).
local function spend(attempt, released)
  table.insert(spent_now, { attempt, released })
end

-- F's grant record, if it is still live, moves to X (save_spent) until the time it had; a
-- record X has of that attempt (a release since, by a version that left g) stays as it is.
local function move_grant_record()
  if grant_record and grant_until > now_ms then
    table.insert(spent_kept, { grant_record, grant_until })
  end
end

-- Before a grant of a new hold (of the free lock, or a hand-over) records `attempt` in F, for
-- the horizon from `from_ms` (default now): the record there moves to X. Returns the fields
-- that record it, for the grant's HSET of F.
local function grant_record_fields(attempt, from_ms)
  move_grant_record()
  grant_record, grant_until, grant_stale = attempt, (from_ms or now_ms) + horizon_ms, false
  return 'g', attempt, 'gu', int(grant_until)
end

-- `attempt` ends, and this call records it in X (spend): F no longer keeps it.
local function drop_grant_record(attempt)
  if grant_record == attempt then
    grant_record, grant_until, grant_stale = nil, nil, true
  end
end

-- A force release: whichever attempt F's record names, X keeps it now.
local function clear_grant_record()
  if grant_record then
    move_grant_record()
    grant_record, grant_until, grant_stale = nil, nil, true
  end
end

-- Records the attempts this call spent, until `horizon_ms` from now, in one ZADD. Forgets at
-- most 8 records whose time has passed (bounded work per call), and makes X expire with its
-- latest record. Every script that spends calls it once, on every path, after its changes.
local function save_spent()
  if grant_stale then
    redis.call('HDEL', F, 'g', 'gu')
    grant_stale = false
  end
  if #spent_now == 0 and #spent_kept == 0 then
    return
  end
  if present[X] == nil then
    -- Its type was read (is_spent), not whether it exists.
    present[X] = redis.call('EXISTS', X) == 1
  end
  local latest = 0
  if #spent_now > 0 then
    latest = now_ms + horizon_ms
    local until_ms = int(latest)
    local members = {}
    for _, record in ipairs(spent_now) do
      table.insert(members, record[2] and (until_ms .. '.5') or until_ms)
      table.insert(members, record[1])
    end
    spent_now = {}
    redis.call('ZADD', X, unpack(members))
  end
  if #spent_kept > 0 then
    local members = {}
    for _, record in ipairs(spent_kept) do
      latest = math.max(latest, record[2])
      table.insert(members, int(record[2]))
      table.insert(members, record[1])
    end
    spent_kept = {}
    redis.call('ZADD', X, 'NX', unpack(members))
  end
  local until_ms = int(latest)
  if present[X] == false then
    -- X is new: nothing to forget, and its latest record is one of these.
    redis.call('PEXPIREAT', X, until_ms)
    return
  end
  local expired = redis.call('ZRANGEBYSCORE', X, '-inf', now_ms, 'LIMIT', 0, 8)
  if #expired > 0 then
    redis.call('ZREM', X, unpack(expired))
  end
  -- X already expires with its latest record (every call that adds one sets it), so on Redis 7
  -- it need only expire later if these are later. GT does nothing when X expires later
  -- already (a record of a longer horizon) or not at all (someone persisted it), and fails on
  -- a node without it (a Cluster being upgraded): then X is read, as on Redis 6.2.
  if HAS_EXPIRE_GT then
    if redis.pcall('PEXPIREAT', X, until_ms, 'GT') == 1 then
      return
    end
    -- Not later: usually X already expires at this very millisecond (calls less than 1 ms
    -- apart); PEXPIRETIME (7.0) tells that from an expiry that is missing.
    local at = redis.pcall('PEXPIRETIME', X)
    if type(at) == 'number' and at >= tonumber(until_ms) then
      return
    end
  end
  local latest = redis.call('ZRANGE', X, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', X, int(tonumber(latest[2])))
end

-- A waiter record: its ttl (ms), attempt, owner, waker (nil if none) and the record as
-- stored; nothing if missing or malformed.
local function waiter_record(ticket)
  local fields = front and front.records[ticket]
    or redis.call('HMGET', W, '#' .. ticket, '$' .. ticket)
  local record = fields[1]
  if not record then
    return nil
  end
  local first = string.find(record, ':', 1, true)
  local second = first and string.find(record, ':', first + 1, true)
  if not second then
    return nil
  end
  -- Not one fairlock wrote (tonumber takes "nan", "inf", "-5"): no waiter, dropped as dead.
  local ttl_text = string.sub(record, 1, first - 1)
  local attempt = string.sub(record, first + 1, second - 1)
  if not is_digits(ttl_text) or ttl_text == '0' or not is_attempt(attempt) then
    return nil
  end
  return tonumber(ttl_text), attempt, string.sub(record, second + 1), fields[2] or nil, record
end

-- The most queue entries one call drops (dead waiters and the entries of waiters that left):
-- each costs O(log n), so no call does unbounded work however many waiters die together. What
-- is left is dropped by the next calls (see head()).
local DROP_BUDGET = 64

local function note_dropped(ticket)
  local number = tonumber(ticket)
  if number and (not lowest_dropped or number < lowest_dropped) then
    lowest_dropped = number
  end
end

-- Keeps what head() learned true after this call removed `tickets` from Q (`removed` of them
-- were there).
local function left_queue(removed, tickets)
  if queue_left then
    queue_left = queue_left - removed
  end
  for _, ticket in ipairs(tickets) do
    if ticket == other_live then
      other_live = nil
    end
  end
end

-- Puts `ticket` in Q (its place: tickets only grow).
local function add_to_queue(ticket)
  front = nil
  local added = redis.call('ZADD', Q, ticket, ticket)
  if queue_left then
    queue_left = queue_left + added
  end
end

-- Forgets `tickets` (at most a few dozen) in a constant number of commands.
local function drop_tickets(tickets)
  if #tickets == 0 then
    return
  end
  queue_touched = true
  front = nil
  dropped = dropped + #tickets
  local records_of, fields = {}, {}
  for i, ticket in ipairs(tickets) do
    records_of[i] = '#' .. ticket
    table.insert(fields, '#' .. ticket)
    table.insert(fields, '$' .. ticket)
    note_dropped(ticket)
  end
  local records = redis.call('HMGET', W, unpack(records_of))
  -- "@<attempt>" is deleted only while it still points at the ticket being dropped.
  local attempts, owners_of = {}, {}
  for i, record in ipairs(records) do
    local attempt = record and string.match(record, '^%d+:(%x+):')
    if attempt then
      table.insert(attempts, '@' .. attempt)
      owners_of[#attempts] = tickets[i]
    end
  end
  if #attempts > 0 then
    local mapped = redis.call('HMGET', W, unpack(attempts))
    for i, ticket in ipairs(mapped) do
      if ticket == owners_of[i] then
        table.insert(fields, attempts[i])
      end
    end
  end
  redis.call('ZREM', Z, unpack(tickets))
  left_queue(redis.call('ZREM', Q, unpack(tickets)), tickets)
  redis.call('HDEL', W, unpack(fields))
end

-- Forgets one ticket whose attempt is known to map to it ("@<attempt>" -> ticket).
local function forget(ticket, attempt)
  queue_touched = true
  front = nil
  dropped = dropped + 1
  note_dropped(ticket)
  redis.call('ZREM', Z, ticket)
  left_queue(redis.call('ZREM', Q, ticket), { ticket })
  redis.call('HDEL', W, '#' .. ticket, '$' .. ticket, '@' .. attempt)
end

-- Removes the queue entry of `attempt`, if it has one: O(log n), nothing left behind. Returns
-- its ticket.
local function dequeue(attempt)
  local ticket = redis.call('HGET', W, '@' .. attempt)
  if ticket then
    forget(ticket, attempt)
  end
  return ticket
end

-- Evicts a few dead waiters from anywhere in the queue: storage follows the live waiters.
local function evict_expired()
  local expired = redis.call('ZRANGEBYSCORE', Z, '-inf', now_ms, 'LIMIT', 0, 16)
  drop_tickets(expired)
end

-- The first live ticket and its ttl, attempt, owner, waker and record as stored. Dead entries
-- in front of it are dropped, within DROP_BUDGET: past it, returns nil and sets head_unknown.
-- Also notes what the tickets it read show: for tidy(), Q's size when it read all of Q
-- (queue_left) and a live ticket behind the head (other_live); and saw_queue's bounds.
local function head()
  -- A few first (the head is usually live), then the rest of the budget in one batch. The
  -- first few as read_front read them, if the queue has not changed since.
  local batch = FRONT
  while true do
    local tickets, deadlines
    if front then
      tickets, deadlines = front.tickets, front.deadlines
    else
      tickets = redis.call('ZRANGE', Q, 0, batch - 1)
    end
    if #tickets < batch then
      -- All of Q (the dead read before are dropped).
      queue_left = #tickets
    end
    if #tickets == 0 then
      queue_last, queue_latest = 0, 0
      return nil
    end
    if not deadlines then
      deadlines = redis.call('ZMSCORE', Z, unpack(tickets))
      if #tickets < batch then
        saw_queue(tickets, deadlines)
      end
    end
    local dead = {}
    for i, ticket in ipairs(tickets) do
      local deadline = tonumber(deadlines[i])
      if deadline and deadline > now_ms then
        local ttl, attempt, owner, waker, record = waiter_record(ticket)
        if ttl then
          drop_tickets(dead)
          for j = i + 1, #tickets do
            local behind = tonumber(deadlines[j])
            if behind and behind > now_ms then
              other_live = tickets[j]
              break
            end
          end
          return ticket, ttl, attempt, owner, waker, record
        end
      end
      table.insert(dead, ticket)
    end
    drop_tickets(dead)
    batch = DROP_BUDGET - dropped
    if batch <= 0 then
      head_unknown = true
      return nil
    end
  end
end

-- Whether this call dropped a queue entry in front of `ticket` (a dead waiter evicted, one
-- that left): then `ticket` may have become the head without knowing it.
local function front_changed(ticket)
  return lowest_dropped ~= nil and lowest_dropped < tonumber(ticket)
end

-- How many waiters are alive: O(log n), however many dead ones are still stored.
local function live_waiters()
  return redis.call('ZCOUNT', Z, '(' .. int(now_ms), '+inf')
end

-- The latest waiter deadline in Z: as saw_queue noted it, 0 if Z was absent when the call
-- began, else read (through pcall: keep_fence is best effort); nil if none is known.
local function latest_waiter_deadline()
  if queue_latest then
    return queue_latest
  end
  if present[Z] == false then
    return 0
  end
  local last = redis.pcall('ZRANGE', Z, -1, -1, 'WITHSCORES')
  if type(last) == 'table' and not last.err and last[2] then
    return tonumber(last[2])
  end
  return nil
end

-- Queue keys disappear by themselves when the last waiter's deadline passes. `own` is the
-- deadline this call just gave its waiter.
local function expire_queue_keys(own)
  latest_deadline = math.max(latest_waiter_deadline() or 0, own)
  local at = int(latest_deadline)
  redis.call('PEXPIREAT', Q, at)
  redis.call('PEXPIREAT', Z, at)
  redis.call('PEXPIREAT', W, at)
end

-- Deletes the queue keys whole, dead entries and all (UNLINK frees a large key off the main
-- thread, so this stays O(1) here).
local function drop_queue()
  redis.call('UNLINK', Q, Z, W)
  queue_touched = true
  queue_gone = true
  queue_left = 0
  front = nil
end

-- Nothing left behind: without live waiters, the queue keys go (unless this call deleted them
-- already). What head() learned spares the count: a live waiter it saw is still there, or Q
-- is empty (a live waiter is always in Q: every call changes Q and Z together, and the keys
-- are never evicted apart, since the server must not evict; see docs/redis.md, "Eviction").
local function tidy()
  if not queue_touched or other_live or queue_gone then
    return
  end
  if queue_left == 0 or live_waiters() == 0 then
    drop_queue()
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
  -- No eviction here (every acquire that finds a queue does it, so the live waiters'
  -- heartbeats do): only the dead in front of the head matter to a hand-over, and head()
  -- clears those.
  local ticket, ttl, attempt, owner, waker = head()
  if not ticket then
    if head_unknown and live_waiters() > 0 then
      -- Live waiters stand behind more dead ones than this call may clear: the lock stays
      -- free, and every waiter looks again; their calls clear the rest and the first live
      -- one takes the lock (a newcomer cannot: it finds the queue in front of it).
      publish('A')
    end
    return
  end
  if queue_left == 1 then
    -- The grantee's entry is all of Q (head() read it whole): the queue keys go at once,
    -- as tidy() would delete them after the entry's removal field by field.
    drop_queue()
  else
    -- A live ticket's record names its attempt, whose "@" entry points back at it.
    forget(ticket, attempt)
  end
  local token = next_token(last_token)
  local until_ms = int(now_ms + ttl)
  -- The grantee is spent: F records it with the token, as for a grant of the free lock (and
  -- the releaser's record, which F may have had, is in X now), until a horizon after its
  -- pending level lapses: the grantee may send an acquire until then.
  redis.call('HSET', F, 't', token, grant_record_fields(attempt, now_ms + ttl))
  redis.call('HSET', H, 'o', owner, 't', token, 'c', 0, 'p', attempt, 'pd', until_ms)
  redis.call('PEXPIREAT', H, until_ms)
  hold_ttl = ttl
  tell(waker, 'G ' .. token .. ' ' .. attempt .. ' ' .. owner)
end

-- F outlives everything of the lock (the hold's lease, the last waiter's deadline) by the
-- fence margin, the last ARGV of every mutating script, then expires: an idle lock leaves no
-- key behind. Tokens still increase after F is gone (next_token: never below the server's
-- clock in microseconds), unless the server's clock steps back by more than the margin.
-- Only a hash of ours is touched, and nothing here can fail on stored data.
local function keep_fence()
  local margin = tonumber(ARGV[#ARGV])
  if not margin then
    return
  end
  -- F is of fairlock's type when check_types or read_fence saw it (or saw it absent: then
  -- this call wrote it, or it is still absent and PEXPIRE does nothing); only `extend` does
  -- not check: its read of the grant record is the check.
  if present[F] == nil then
    local f = redis.pcall('HMGET', F, 'g', 'gu')
    if type(f) ~= 'table' or f.err then
      return
    end
    if f[1] and is_digits(f[2]) then
      grant_record, grant_until = f[1], tonumber(f[2])
    end
  end
  -- The hold's lease: as this call set it, else as stored (a missing H counts 0).
  local live = hold_ttl or math.max(redis.call('PTTL', H), 0)
  -- The grant record F keeps (see F above).
  if grant_record then
    live = math.max(live, grant_until - now_ms)
  end
  -- The last waiter's deadline: as a join of this call set it (only a join adds one), else as
  -- known or stored (latest_waiter_deadline), none once this call deleted the queue keys.
  local last = latest_deadline or (not queue_gone and latest_waiter_deadline())
  if last then
    live = math.max(live, last - now_ms)
  end
  redis.call('PEXPIRE', F, int(live + margin))
end

-- Every mutating script's reply goes through here (see crates/fairlock-redis/src/scripts.rs):
-- F's expiry follows what the operation did. A refusal (an error reply) wrote nothing.
local function finish(reply)
  if type(reply) == 'table' and reply.err then
    return reply
  end
  -- Best effort, and after the operation's writes: a key it reads may be out of reach (on the
  -- node a slot is migrating away from, for `extend`, which has no probe), and a failure here
  -- must not turn a done operation into an error.
  pcall(keep_fence)
  return reply
end
