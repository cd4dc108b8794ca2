-- idem heartbeat / complete / fail / release / unclaim / poison-claim of record k,
-- accepted only with the current fence while in flight: op (h, c, f, x, u — x
-- that also takes back the claim's attempt —, p — the record poisoned, the
-- attempt taken back), fence (as written),
-- ms (lease for h, retention for c and f), result (c and f), the call's
-- nonce; now the server time in ms. The script's ARGV holds five arguments
-- per key, in that order. A settle records its nonce (tag 'S'), so a second
-- run of the same call (a client's resend after a broken connection) answers
-- 1 again.
-- Returns 1 when applied, 0 for a stale fence.
local function owned(k, op, fence, ms, result, nonce, now)
  local r = load(k)
  if not r then return 0 end
  -- Fences are compared as written (%d: tostring would round 16-digit numbers).
  local same = sformat('%d', r.f) == fence
  if same and r.tag == 83 and sameCall(r.n, nonce) and r.e > now then return 1 end
  -- Past its retention the record is gone, even before Redis evicts it.
  if r.st ~= 1 or not same or r.e <= now then return 0 end
  r.u = now
  if op == 'h' then
    r.l = now + ms
    if r.e < now + ms then r.e = now + ms end
  elseif op == 'c' or op == 'f' then
    r.st, r.r, r.l, r.e, r.tag, r.n = 2, result, 0, now + ms, 83, nonce
    if op == 'f' then r.st = 3 end
  elseif op == 'x' or op == 'u' or op == 'p' then
    r.st, r.l, r.tag, r.n = 5, 0, 83, nonce
    if op == 'p' then r.st = 4 end
    if op ~= 'x' and r.a > 0 then r.a = r.a - 1 end
  else
    return redis.error_reply('idem: unknown op ' .. op)
  end
  save(k, r)
  return 1
end
