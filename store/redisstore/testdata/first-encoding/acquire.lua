-- idem acquire: KEYS[1] the record; ARGV fingerprint, lease ms, unsettled
-- retention ms (>= lease), max attempts (0 = none), nonce of the call.
-- A client may run the script twice for one call (go-redis resends a command
-- whose connection broke before the answer): field n keeps the outcome and
-- nonce of the call that took the claim, and a second run returns that claim.
-- Fields: s state, f fence, p fingerprint, a attempts, l lease until (ms),
-- e expires at (ms), u updated at (ms), r result.
-- Returns {outcome, state, fence, fingerprint, attempts, lease, expires, updated, result}.
-- A new fence is max(previous fence + 1, server time in microseconds), so
-- fences keep growing after the record expired or was deleted. Fences are
-- written with %d: tostring would round 16-digit numbers.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local fp, lease, keep, maxa, nonce = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local r = redis.call('HMGET', KEYS[1], 's', 'f', 'p', 'a', 'l', 'e', 'u', 'r', 'n')
local st = tonumber(r[1])
if st == 1 and r[9] and string.sub(r[9], 2) == nonce and tonumber(r[6]) > now then
  -- this call's own claim, taken by an earlier run of the script
  return {tonumber(string.sub(r[9], 1, 1)), 1, tonumber(r[2]), r[3], tonumber(r[4]), tonumber(r[5]), tonumber(r[6]), tonumber(r[7]), false}
end
if not st or tonumber(r[6]) <= now then
  local fence = floor
  if st then
    fence = math.max(tonumber(r[2]) + 1, floor)
    redis.call('HDEL', KEYS[1], 'r')
  end
  redis.call('HSET', KEYS[1], 's', 1, 'f', string.format('%d', fence), 'p', fp, 'a', 1, 'l', now + lease, 'e', now + keep, 'u', now, 'n', '1' .. nonce)
  redis.call('PEXPIREAT', KEYS[1], now + keep)
  return {1, 1, fence, fp, 1, now + lease, now + keep, now, false}
end
local fence, attempts, lu, exp, upd = tonumber(r[2]), tonumber(r[4]), tonumber(r[5]), tonumber(r[6]), tonumber(r[7])
local function answer(outcome) return {outcome, st, fence, r[3], attempts, lu, exp, upd, r[8]} end
if r[3] ~= fp then return answer(5) end
if st == 1 and lu > now then return answer(3) end
if st == 2 or st == 3 then return answer(4) end
if st == 4 then return answer(6) end
if exp < now + keep then exp = now + keep end
if maxa > 0 and attempts >= maxa then
  redis.call('HSET', KEYS[1], 's', 4, 'e', exp, 'u', now)
  redis.call('PEXPIREAT', KEYS[1], exp)
  st, upd = 4, now
  return answer(6)
end
local outcome = 1
if st == 1 then outcome = 2 end
fence, attempts, lu, upd, st = math.max(fence + 1, floor), attempts + 1, now + lease, now, 1
redis.call('HSET', KEYS[1], 's', 1, 'f', string.format('%d', fence), 'a', attempts, 'l', lu, 'e', exp, 'u', now, 'n', outcome .. nonce)
redis.call('PEXPIREAT', KEYS[1], exp)
return answer(outcome)
