-- idem acquire of record k: fp the fingerprint (encoded), lease ms,
-- unsettled retention ms keep (>= lease), maxa max attempts (0 = none), the
-- call's nonce; now the server time in ms, floor in µs. Returns {outcome,
-- record} (the record packed, see above). The script's ARGV holds five
-- arguments per key, in that order.
-- A client may run the script twice for one call (go-redis resends a command
-- whose connection broke before the answer): the record keeps the nonce of
-- the call that took the claim, and a second run returns that claim.
-- A new fence is max(previous fence + 1, server time in microseconds), so
-- fences keep growing after the record expired or was deleted.
local function acquire(k, fp, lease, keep, maxa, nonce, now, floor)
  local r = load(k)
  if r and r.st == 1 and (r.tag == 49 or r.tag == 50) and r.n == nonce and r.e > now then
    return {r.tag - 48, packed(r)} -- this call's own claim, taken by an earlier run of the script
  end
  if not r or r.e <= now then
    local fence = floor
    if r then fence = math.max(r.f + 1, floor) end
    return {1, save(k, {st = 1, f = fence, a = 1, l = now + lease, e = now + keep, u = now, tag = 49, n = nonce, p = fp, r = ''})}
  end
  if r.p ~= fp then return {5, packed(r)} end
  if r.st == 1 and r.l > now then return {3, packed(r)} end
  if r.st == 2 or r.st == 3 then return {4, packed(r)} end
  if r.st == 4 then return {6, packed(r)} end
  if r.e < now + keep then r.e = now + keep end
  if maxa > 0 and r.a >= maxa then
    -- Poisoning takes a fence of its own: nothing fenced on the claim it
    -- ends (a DeleteUpTo of it) touches it.
    r.st, r.u, r.f = 4, now, math.max(r.f + 1, floor)
    return {6, save(k, r)}
  end
  local outcome = 1
  if r.st == 1 then outcome = 2 end
  r.st, r.f, r.a, r.l, r.u, r.tag, r.n, r.r = 1, math.max(r.f + 1, floor), r.a + 1, now + lease, now, 48 + outcome, nonce, ''
  return {outcome, save(k, r)}
end
