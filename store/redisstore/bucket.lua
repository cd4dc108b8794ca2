-- Bucketed records (Config.Buckets): instead of a key of its own, a record
-- is a field of a hash, its bucket, which holds the records of many keys
-- (Redis stores a small hash as one listpack: no key, value object or
-- expiry entry per record). A call's location is {s = the record's own key,
-- b = its bucket, f = its field}: both keys in one cluster slot. A record
-- in s (written before buckets were turned on, or too large for a bucket)
-- is read there and moved into b by its next transition. What a call's
-- load learns for its save goes into its location too (inb, str: the
-- record is in b, in s; room: flag 8's TTL), set to false, never nil,
-- where it no longer holds: a batch reuses one location table for all its
-- calls (batchTail).
-- The field is the 16 bytes of a compact key, or 0 and the key (1, the
-- key and 1 for a key of 15 bytes: no other field is 16 bytes long). The
-- value is packed, big-endian:
--   B flags: 64 if the fingerprint is a digest + 32 if in flight or if a
--     settle wrote the record + 16 if the fence is an offset (below) + 8 if
--     the bucket's TTL was at least the expiry plus the expiry less the
--     last transition (e + (e - u)) when the value was written + the state,
--   the fence: I4 d where fence = (u + 1) * 1000 - d (u the last transition
--     in ms; flag 16: a fence taken in the last 71 minutes, as a claim's
--     fence is the server's µs clock), else I7,
--   B attempts, I6 expires at (ms), I4 expires at less updated at (ms),
--   in flight: I6 lease until, B tag, c10 nonce (as in record.lua);
--   written by a settle: c4, the settle's nonce without the process part
--     (the fence names the owner, the counter the call);
--   the fingerprint: its 16 bytes if a digest, else B length and the string;
--   the result to the end.
-- A completed record with a compact key, a digest and a 28-byte result is
-- 64 bytes: the server's default hash-max-listpack-value.
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
local HEAD, OFFSET_HEAD = '>BI7BI6I4', '>BI4BI6I4'
-- offsetFence: a value with flags fl holds its fence as an offset (flag 16).
local function offsetFence(fl)
  return fl % 32 >= 16
end
-- unpackValue reads a bucket's value; room: what flag 8 says of the
-- bucket's TTL, else nil.
local function unpackValue(v)
  local fl, f, a, e, age, pos = sbyte(v, 1)
  if offsetFence(fl) then -- a short value may be shorter than HEAD
    local d
    fl, d, a, e, age, pos = sunpack(OFFSET_HEAD, v)
    f = (e - age + 1) * 1000 - d
  else
    fl, f, a, e, age, pos = sunpack(HEAD, v)
  end
  local st, room = fl % 8, nil
  -- The bucket's TTL only grows while the bucket exists (nothing shortens
  -- it), so what a flagged value says of it still holds.
  if fl % 16 >= 8 then room = e + age end
  local r = {st = st, f = f, a = a, e = e, u = e - age, l = 0, tag = 0, n = '', raw = v}
  if st == 1 then
    r.l, r.tag, pos = sunpack('>I6B', v, pos)
    r.n, pos = ssub(v, pos, pos + 9), pos + 10
  elseif fl % 64 >= 32 then
    r.tag, r.n, pos = 83, ssub(v, pos, pos + 3), pos + 4
  end
  if fl >= 64 then
    r.p, pos = '\1' .. ssub(v, pos, pos + 15), pos + 16
  else
    local n = sbyte(v, pos)
    r.p, pos = '\0' .. ssub(v, pos + 1, pos + n), pos + 1 + n
  end
  r.r = ssub(v, pos)
  return r, room
end
-- expiresAt: the expiry of a bucket's value.
local function expiresAt(v)
  if offsetFence(sbyte(v, 1)) then return (sunpack('>I6', v, 7)) end
  return (sunpack('>I6', v, 10))
end
local stringLoad, stringSave = load, save
load = function(k)
  local v = rcall('HGET', k.b, k.f)
  if v then
    k.inb = true
    local r, room = unpackValue(v)
    k.room = room or false
    return r
  end
  local r = stringLoad(k.s)
  k.str = r ~= nil
  return r
end
-- bpack returns r packed for a bucket, or nil where it does not fit one;
-- room: flag 8 (see above).
local function bpack(r, room)
  if r.a > 255 or r.f >= 2^56 or r.e - r.u >= 2^32 then return nil end
  local fl, p = r.st, r.p
  if room then fl = fl + 8 end
  if #p == 17 and sbyte(p, 1) == 1 then
    fl, p = fl + 64, ssub(p, 2)
  elseif #p <= 256 then
    p = schar(#p - 1) .. ssub(p, 2)
  else
    return nil
  end
  local mid = ''
  if r.st == 1 then
    if #r.n ~= 10 then return nil end
    fl, mid = fl + 32, spack('>I6B', r.l, r.tag) .. r.n
  elseif r.tag == 83 and #r.n >= 4 then
    fl, mid = fl + 32, ssub(r.n, -4)
  end
  local head
  local d = (r.u + 1) * 1000 - r.f
  if d >= 1 and d < 2^32 then
    head = spack(OFFSET_HEAD, fl + 16, d, r.a, r.e, r.e - r.u)
  else
    head = spack(HEAD, fl, r.f, r.a, r.e, r.e - r.u)
  end
  local v = head .. mid .. p .. r.r
  if #v > BUCKET_VALUE_MAX then return nil end
  return v
end
-- sweepBucket deletes the expired records of bucket b once a minute, a
-- few hundred fields per call (HSCAN: a small bucket, one listpack, comes
-- whole): field "" holds the time of the next sweep and, while a sweep is
-- under way, its HSCAN cursor.
local function sweepBucket(b, now)
  local mark = rcall('HGET', b, '')
  if mark and sunpack('>I6', mark) > now then return end
  local cursor = '0'
  if mark and #mark > 6 then cursor = ssub(mark, 7) end
  local page = rcall('HSCAN', b, cursor, 'COUNT', 256)
  local fields = page[2]
  for i = 1, #fields, 2 do
    if fields[i] ~= '' and expiresAt(fields[i + 1]) <= now then
      rcall('HDEL', b, fields[i])
    end
  end
  if page[1] == '0' then
    rcall('HSET', b, '', spack('>I6', now + 60000))
  else
    rcall('HSET', b, '', spack('>I6', now) .. page[1]) -- the next new field goes on
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
-- the next writes need not extend it again. A bucket just made has no TTL
-- (PEXPIRETIME answers -1): its first write extends it.
save = function(k, r)
  local span = r.e - r.u
  local ask, room = true, true
  if k.room and r.e <= k.room then
    ask, room = false, r.e + span <= k.room
  end
  local v = #k.f <= 64 and bpack(r, room)
  if not v then
    if k.inb then rcall('HDEL', k.b, k.f); k.inb = false end
    k.str = true
    return stringSave(k.s, r)
  end
  -- One new field in eight (by its fence: not by the key, which a workload
  -- may end alike every time) checks the sweep time.
  if rcall('HSET', k.b, k.f, v) == 1 and r.f % 8 == 0 then sweepBucket(k.b, r.u) end
  k.inb = true
  if k.str then rcall('DEL', k.s); k.str = false end
  if ask and rcall('PEXPIRETIME', k.b) < r.e + span then
    rcall('PEXPIREAT', k.b, sformat('%d', r.e + 2 * span)) -- see record.lua's save
  end
  return v
end
-- remove deletes the record of k from its bucket and its own key.
remove = function(k)
  rcall('HDEL', k.b, k.f)
  rcall('DEL', k.s)
end
-- sameCall: the nonce of a settle's record is the call's (a bucket keeps
-- its last four bytes).
sameCall = function(stored, nonce)
  return stored == nonce or (#stored == 4 and stored == ssub(nonce, -4))
end
