-- release: remove one attempt's level from the hold with the matching owner and token, and
-- end the attempt; at 0 levels, hand over.
--
-- KEYS: H, Q, Z, W, F, X (see prelude.lua)
-- ARGV: 1 owner, 2 token, 3 attempt, 4 resend horizon ms, 5 channel, 6 fence margin ms
-- Returns a string: "R <remaining hold count>"; also when a release of the attempt removed
-- its level before (this one is re-sent): "R <count>" while that hold lives, "R 0" once it is
-- gone. "N" when owner holds no hold with that token (expired, force-released) or one without
-- a level of the attempt, and no release removed it: nothing changed but the attempt is
-- recorded as spent.
local owner, token, attempt = ARGV[1], ARGV[2], ARGV[3]
horizon_ms = tonumber(ARGV[4])

local problem = probe_slot(false) or check_types(X)
if problem then
  return problem
end
local hold, fence
hold, problem = read_hold(attempt)
if problem then
  return problem
end
fence, problem = read_fence()
if problem then
  return problem
end

-- Whatever happens, the attempt ends here (spend, below): F no longer keeps its record.
drop_grant_record(attempt)
hold = settle(hold, true)
local reply, released, _
if not hold or hold.owner ~= owner or hold.token ~= token then
  -- Released before, by this request's first copy: the hold is gone since, not lost.
  _, released = is_spent(attempt)
  reply = released and 'R 0' or 'N'
elseif not remove_level(hold, attempt) then
  _, released = is_spent(attempt)
  reply = released and ('R ' .. int(count(hold))) or 'N'
else
  released = true
  local remaining = count(hold)
  if remaining == 0 then
    free_hold()
    hand_over(fence.token)
    tidy()
  end
  reply = 'R ' .. int(remaining)
end
-- Whatever happened, the attempt has ended: a re-sent acquire of it changes nothing. (Its
-- record was read only where the hold did not say what an earlier copy did.)
spend(attempt, released)
save_spent()
return reply
