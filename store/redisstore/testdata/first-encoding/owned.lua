-- idem heartbeat / complete / fail / release, accepted only with the current
-- fence while in flight. KEYS[1] the record; ARGV op (h, c, f, x), fence,
-- ms (lease for h, retention for c and f), result (c and f), nonce of the
-- call. A settle records 'S' .. nonce in field n, so a second run of the same
-- call (a client's resend after a broken connection) answers 1 again.
-- Returns 1 when applied, 0 for a stale fence.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local r = redis.call('HMGET', KEYS[1], 's', 'f', 'e', 'n')
if r[2] == ARGV[2] and r[4] == 'S' .. ARGV[5] and tonumber(r[3]) > now then return 1 end
-- Past its retention the record is gone, even before Redis evicts it.
if tonumber(r[1]) ~= 1 or r[2] ~= ARGV[2] or tonumber(r[3]) <= now then return 0 end
local op, ms = ARGV[1], tonumber(ARGV[3])
if op == 'h' then
  local exp = tonumber(r[3])
  if exp < now + ms then exp = now + ms end
  redis.call('HSET', KEYS[1], 'l', now + ms, 'e', exp, 'u', now)
  redis.call('PEXPIREAT', KEYS[1], exp)
elseif op == 'c' or op == 'f' then
  local st = 2
  if op == 'f' then st = 3 end
  redis.call('HSET', KEYS[1], 's', st, 'r', ARGV[4], 'l', 0, 'e', now + ms, 'u', now, 'n', 'S' .. ARGV[5])
  redis.call('PEXPIREAT', KEYS[1], now + ms)
elseif op == 'x' then
  redis.call('HSET', KEYS[1], 's', 5, 'l', 0, 'u', now, 'n', 'S' .. ARGV[5])
else
  return redis.error_reply('idem: unknown op ' .. op)
end
return 1
