-- extend: lengthen the lease of the hold with the matching owner and token. A pending level
-- is confirmed only by its own attempt's acquire, never here: another level's renewal must not
-- keep a dead grantee's level alive.
--
-- KEYS: H, Q, Z, W, F, X (see prelude.lua); only H is used.
-- ARGV: 1 owner, 2 token, 3 lease ms, 4 channel, 5 fence margin ms
-- Returns a string: "1" extended, "0" not held by owner with that token (no change).
-- The lease is never shortened, so applying it again (a re-send) is harmless.
local owner, token, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])

local hold, problem = read_hold()
if problem then
  return problem
end
if not hold or hold.owner ~= owner or hold.token ~= token then
  return '0'
end
hold = settle(hold, true)
if not hold then
  return '0'
end
lengthen(lease)
return '1'
