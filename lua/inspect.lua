-- inspect: a read-only snapshot (O(number of queue entries)), or of the holder alone
-- (a few commands, whatever the queue holds).
--
-- KEYS: H, Q, Z, W, F, X (see prelude.lua); X is not used.
-- ARGV: 1 (optional) "h": the holder only, no waiters
-- Returns an array of strings:
--   [1] lock name ("" if never recorded)
--   [2..6] holder: owner, hold count (a live pending level included), token, lease remaining
--          ms, confirmed ("1", or "0" while a pending level lives); all "" when free
--   then one triple per live waiter, first in line first: owner, attempt, ms until its
--   deadline
local problem = probe_slot(true) or check_types(F)
if problem then
  return problem
end
local hold
hold, problem = read_hold()
if problem then
  return problem
end
hold = settle(hold, false)

local out = { redis.call('HGET', F, 'n') or '' }
if hold then
  table.insert(out, hold.owner)
  table.insert(out, int(count(hold)))
  table.insert(out, hold.token)
  table.insert(out, int(math.max(redis.call('PTTL', H), 0)))
  table.insert(out, hold.pending and '0' or '1')
else
  for _ = 1, 5 do
    table.insert(out, '')
  end
end
if present[Q] and ARGV[1] ~= 'h' then
  for _, ticket in ipairs(redis.call('ZRANGE', Q, 0, -1)) do
    local deadline = tonumber(redis.call('ZSCORE', Z, ticket))
    if deadline and deadline > now_ms then
      local ttl, attempt, owner = waiter_record(ticket)
      if ttl then
        table.insert(out, owner)
        table.insert(out, attempt)
        table.insert(out, int(deadline - now_ms))
      end
    end
  end
end
return out
