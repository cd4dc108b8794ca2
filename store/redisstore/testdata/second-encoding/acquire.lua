-- The previous release's bucket script (records in buckets as format 2), as
-- the store composed it at commit a85f4f6: frozen for TestRecordsOfTheSecondEncoding.
-- idem record encoding, shared by the acquire and owned scripts. A record is
-- one string (format 1), packed big-endian:
--   B format (1), B state, I8 fence, I4 attempts, I6 lease until (ms),
--   I6 expires at (ms), I6 updated at (ms), B tag, B+bytes nonce,
--   B+bytes fingerprint, then the result to the end of the string.
-- The tag says what the nonce did: 49 ('1') or 50 ('2') the claim it took
-- (Acquired or TakenOver), 83 ('S') the settle. The fingerprint is as the
-- client encodes it (1 + 16 bytes for a 32-digit hex digest, 0 + the string
-- otherwise). The key's TTL is the expiry (PXAT).
-- A record of the first encoding (a hash with fields s f p a l e u r n) is
-- read as well, and written in this encoding on its next transition.
local FMT = '>BBI8I4I6I6I6BBc0Bc0'
local function unhex(h)
  return (h:gsub('..', function(c) return string.char(tonumber(c, 16)) end))
end
local function load(k)
  local ok, v = pcall(redis.call, 'GET', k)
  if ok then
    if not v then return nil end
    local _, st, f, a, l, e, u, tag, n, p, pos = struct.unpack(FMT, v)
    return {st = st, f = f, a = a, l = l, e = e, u = u, tag = tag, n = n, p = p, r = string.sub(v, pos), raw = v}
  end
  local h = redis.call('HMGET', k, 's', 'f', 'p', 'a', 'l', 'e', 'u', 'r', 'n')
  if not h[1] then return nil end
  local p = h[3] or ''
  if #p == 32 and not p:find('[^0-9a-f]') then p = '\1' .. unhex(p) else p = '\0' .. p end
  local n = h[9] or ''
  return {st = tonumber(h[1]), f = tonumber(h[2]), a = tonumber(h[4]), l = tonumber(h[5]) or 0,
    e = tonumber(h[6]), u = tonumber(h[7]) or 0, tag = string.byte(n, 1) or 0, n = string.sub(n, 2), p = p, r = h[8] or ''}
end
local function pack(r)
  return struct.pack(FMT, 1, r.st, r.f, r.a, r.l, r.e, r.u, r.tag, #r.n, r.n, #r.p, r.p) .. r.r
end
-- save writes r with its expiry as the key's TTL and returns what it wrote.
local function save(k, r)
  local v = pack(r)
  redis.call('SET', k, v, 'PXAT', r.e)
  return v
end
-- remove deletes the record at k.
local function remove(k)
  redis.call('DEL', k)
end
-- sameCall: the nonce a record keeps is the one of the call at hand.
local function sameCall(stored, nonce)
  return stored == nonce
end
-- packed returns r as stored (unchanged records are answered as read).
local function packed(r)
  return r.raw or pack(r)
end
-- Bucketed records (Config.Buckets): instead of a key of its own, a record
-- is a field of a hash, its bucket, which holds the records of many keys
-- (Redis stores a small hash as one listpack: no key, value object or
-- expiry entry per record). A call's location is {s = the record's own key,
-- b = its bucket, f = its field}: s and b are in the same cluster slot, and a
-- record still in s (written before buckets were on, or too large for a
-- bucket) is read there and moved into b by its next transition.
-- The field is the 16 bytes of a compact key, or 0 and the key (1, the
-- key and 1 for a key of 15 bytes: no other field is 16 bytes long). The
-- value is packed (format 2), big-endian:
--   B flags: 128 + 64 if the fingerprint is a digest + 32 if a settle wrote
--     the record + 8 if the bucket's TTL was at least the expiry plus the
--     expiry less the last transition (e + (e - u)) when the value was
--     written + the state,
--   I7 fence, B attempts, I6 expires at (ms), I4 expires at less updated
--   at (ms),
--   in flight: I6 lease until, B tag, c10 nonce (as in format 1);
--   written by a settle: c4, the settle's nonce without the process part
--     (the fence names the owner, the counter the call);
--   the fingerprint: its 16 bytes if a digest, else B length and the string;
--   the result to the end.
-- A record with more than 255 attempts, a fence of 2^56 or more, or an
-- expiry 2^32 ms (49 days) or more after its last transition keeps a key
-- of its own.
-- Redis 7.0 cannot expire a field: a record past its expiry is absent to
-- every script, and a new field written into a bucket a minute or more
-- after its last sweep deletes the bucket's expired fields, a few hundred
-- per call (field "" holds the time of the next sweep; one new field in
-- eight, chosen by its fence, a clock reading in µs, looks at it). The
-- bucket's TTL is kept past the latest expiry of any record written into
-- it (when a write needs more, by as much again as that record's
-- retention, so the next writes need not move it), so an idle bucket goes
-- as a whole.
local BUCKET_VALUE_MAX = 128
local B_FMT = '>BI7BI6I4'
local stringLoad, stringSave = load, save
load = function(k)
  local v = redis.call('HGET', k.b, k.f)
  if not v then
    local r = stringLoad(k.s)
    k.str = r ~= nil
    return r
  end
  k.inb = true
  local fl, f, a, e, age, pos = struct.unpack(B_FMT, v)
  local st = fl % 8
  -- The bucket's TTL only grows while the bucket exists (nothing shortens
  -- it), so what a flagged value says of it still holds.
  if fl % 16 >= 8 then k.room = e + age end
  local r = {st = st, f = f, a = a, e = e, u = e - age, l = 0, tag = 0, n = '', raw = v}
  if st == 1 then
    r.l, r.tag, pos = struct.unpack('>I6B', v, pos)
    r.n, pos = string.sub(v, pos, pos + 9), pos + 10
  elseif fl % 64 >= 32 then
    r.tag, r.n, pos = 83, string.sub(v, pos, pos + 3), pos + 4
  end
  if fl >= 192 then
    r.p, pos = '\1' .. string.sub(v, pos, pos + 15), pos + 16
  else
    local n = string.byte(v, pos)
    r.p, pos = '\0' .. string.sub(v, pos + 1, pos + n), pos + 1 + n
  end
  r.r = string.sub(v, pos)
  return r
end
-- bpack returns r packed for a bucket, or nil where it does not fit one;
-- room: flag 8 (see above).
local function bpack(r, room)
  if r.a > 255 or r.f >= 2^56 or r.e - r.u >= 2^32 then return nil end
  local fl, p = 128 + r.st, r.p
  if room then fl = fl + 8 end
  if #p == 17 and string.byte(p, 1) == 1 then
    fl, p = fl + 64, string.sub(p, 2)
  elseif #p <= 256 then
    p = string.char(#p - 1) .. string.sub(p, 2)
  else
    return nil
  end
  local mid = ''
  if r.st == 1 then
    if #r.n ~= 10 then return nil end
    mid = struct.pack('>I6B', r.l, r.tag) .. r.n
  elseif r.tag == 83 and #r.n >= 4 then
    fl, mid = fl + 32, string.sub(r.n, -4)
  end
  local v = struct.pack(B_FMT, fl, r.f, r.a, r.e, r.e - r.u) .. mid .. p .. r.r
  if #v > BUCKET_VALUE_MAX then return nil end
  return v
end
-- sweepBucket deletes the expired records of bucket b once a minute, a
-- few hundred fields per call (HSCAN: a small bucket, one listpack, comes
-- whole): field "" holds the time of the next sweep and, while a sweep is
-- under way, its HSCAN cursor.
local function sweepBucket(b, now)
  local mark = redis.call('HGET', b, '')
  if mark and struct.unpack('>I6', mark) > now then return end
  local cursor = '0'
  if mark and #mark > 6 then cursor = string.sub(mark, 7) end
  local page = redis.call('HSCAN', b, cursor, 'COUNT', 256)
  local fields = page[2]
  for i = 1, #fields, 2 do
    if fields[i] ~= '' and struct.unpack('>I6', fields[i + 1], 10) <= now then
      redis.call('HDEL', b, fields[i])
    end
  end
  if page[1] == '0' then
    redis.call('HSET', b, '', struct.pack('>I6', now + 60000))
  else
    redis.call('HSET', b, '', struct.pack('>I6', now) .. page[1]) -- the next new field goes on
  end
end
-- save writes r (r.u is now: every transition sets it) where it fits: its
-- bucket, else its own key; and deletes the other copy. The bucket's TTL
-- must stay past r.e: asked with PEXPIRETIME, unless the value r replaces
-- said enough of it (flag 8, k.room) — as it does for the settle of a claim
-- whose retention is no longer than the claim's (the claim's save made the
-- TTL last the claim's retention twice over), which saves the settle a call.
-- A value is flagged when the TTL is known to reach r.e + (r.e - r.u);
-- where the TTL is extended, it is extended to r.e + 2 (r.e - r.u), so that
-- the next writes need not extend it again.
save = function(k, r)
  local span = r.e - r.u
  local ask, room = true, true
  if k.room and r.e <= k.room then
    ask, room = false, r.e + span <= k.room
  end
  local v = #k.f <= 64 and bpack(r, room)
  if not v then
    if k.inb then redis.call('HDEL', k.b, k.f); k.inb = nil end
    k.str = true
    return stringSave(k.s, r)
  end
  -- One new field in eight (by its fence: not by the key, which a workload
  -- may end alike every time) checks the sweep time.
  if redis.call('HSET', k.b, k.f, v) == 1 and r.f % 8 == 0 then sweepBucket(k.b, r.u) end
  k.inb = true
  if k.str then redis.call('DEL', k.s); k.str = nil end
  if ask and redis.call('PEXPIRETIME', k.b) < r.e + span then
    redis.call('PEXPIREAT', k.b, r.e + 2 * span)
  end
  return v
end
-- remove deletes the record of k from its bucket and its own key.
remove = function(k)
  redis.call('HDEL', k.b, k.f)
  redis.call('DEL', k.s)
end
-- sameCall: the nonce of a settle's record is the call's (a bucket keeps
-- its last four bytes).
sameCall = function(stored, nonce)
  return stored == nonce or (#stored == 4 and stored == string.sub(nonce, -4))
end
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
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local i = 1
local j = (i - 1) * 6 + 1
return acquire({s = KEYS[2 * i - 1], b = KEYS[2 * i], f = ARGV[(i - 1) * 6 + 1]}, ARGV[j + 1], tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4]), ARGV[j + 5], now, floor)
