-- force_release: free the hold with the given token, whoever holds it and whatever its
-- count, and hand over. Naming the token makes a re-send harmless: no later hold has it. The
-- token is remembered in X ("f:<token>"), so a re-send answers "1" as the first copy did.
--
-- KEYS: H, Q, Z, W, F, X (see prelude.lua)
-- ARGV: 1 token, 2 resend horizon ms, 3 channel, 4 fence margin ms
-- Returns a string: "1" if that hold existed (it is freed and handed on), or a force release
-- of it freed it before (a re-send); else "0".
local token = ARGV[1]
horizon_ms = tonumber(ARGV[2])

local problem = probe_slot(false) or check_types(X)
if problem then
  return problem
end
local hold, fence
hold, problem = read_hold()
if problem then
  return problem
end
fence, problem = read_fence()
if problem then
  return problem
end

hold = settle(hold, true)
if not hold or hold.token ~= token then
  return is_spent('f:' .. token) and '1' or '0'
end
free_hold()
spend('f:' .. token)
clear_grant_record()
hand_over(fence.token)
tidy()
save_spent()
return '1'
