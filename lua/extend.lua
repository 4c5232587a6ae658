-- extend: set the lease of the holder with the matching token (confirms a pending grant).
--
-- KEYS: H, Q, Z, W, F, C (see prelude.lua)
-- ARGV: 1 owner, 2 token, 3 lease ms, 4 request id
-- Returns a string: "1" extended, "0" not held by owner with that token (no change).
-- Applying it twice only moves the lease end a little later, so it needs no replay check,
-- and it leaves hr/hv alone so a re-sent release or acquire of this hold is still recognised.
local owner, token, lease = ARGV[1], ARGV[2], ARGV[3]

if redis.call('HGET', H, 'o') ~= owner or redis.call('HGET', H, 't') ~= token then
  return '0'
end
redis.call('HDEL', H, 'p')
redis.call('PEXPIRE', H, lease)
return '1'
