-- inspect: a read-only snapshot (O(number of queue entries)).
--
-- KEYS: H, Q, Z, W, F, C (see prelude.lua)
-- ARGV: none
-- Returns an array of strings:
--   [1] lock name ("" if never recorded)
--   [2..6] holder: owner, hold count, token, lease remaining ms, confirmed ("1"/"0");
--          all "" when the lock is free
--   then one pair per live waiter, first in line first: owner, ms until its deadline
local out = { redis.call('HGET', F, 'n') or '' }
local holder = redis.call('HMGET', H, 'o', 'c', 't', 'p')
if holder[1] then
  local pending = holder[4] == '1'
  table.insert(out, holder[1])
  table.insert(out, holder[2])
  table.insert(out, holder[3])
  table.insert(out, int(math.max(redis.call('PTTL', H), 0)))
  table.insert(out, pending and '0' or '1')
else
  for _ = 1, 5 do
    table.insert(out, '')
  end
end
for _, ticket in ipairs(redis.call('LRANGE', Q, 0, -1)) do
  local deadline = tonumber(redis.call('ZSCORE', Z, ticket))
  if deadline and deadline > now_ms then
    local _, owner = waiter_record(ticket)
    if owner then
      table.insert(out, owner)
      table.insert(out, int(deadline - now_ms))
    end
  end
end
return out
