-- Bucketed records (Config.Buckets): instead of a key of its own, a record
-- is a field of a hash, its bucket, which holds the records of many keys
-- (Redis stores a small hash as one listpack: no key, value object or
-- expiry entry per record). A call's location is {s = the record's own key,
-- b = its bucket, o = the bucket's name in the previous release, f = its
-- field}: all three in one cluster slot. A record still in s (written
-- before buckets were on, or too large for a bucket) or in o (written by
-- the previous release) is read there and moved into b by its next
-- transition. What a call's load learns for its save goes into its
-- location too (inb, ino, str: the record is in b, o, s; room: flag 8's
-- TTL; ttl: b's PEXPIRETIME), set to false, never nil, where it no longer
-- holds: a batch reuses one location table for all its calls (batchTail).
-- The field is the 16 bytes of a compact key, or 0 and the key (1, the
-- key and 1 for a key of 15 bytes: no other field is 16 bytes long). The
-- value is packed (format 3), big-endian:
--   B flags: 64 if the fingerprint is a digest + 32 if in flight or if a
--     settle wrote the record + 16 if the fence is an offset (below) + 8 if
--     the bucket's TTL was at least the expiry plus the expiry less the
--     last transition (e + (e - u)) when the value was written + the state,
--   the fence: I4 d where fence = (u + 1) * 1000 - d (u the last transition
--     in ms; flag 16: a fence taken in the last 71 minutes, as a claim's
--     fence is the server's µs clock), else I7,
--   B attempts, I6 expires at (ms), I4 expires at less updated at (ms),
--   in flight: I6 lease until, B tag, c10 nonce (as in format 1);
--   written by a settle: c4, the settle's nonce without the process part
--     (the fence names the owner, the counter the call);
--   the fingerprint: its 16 bytes if a digest, else B length and the string;
--   the result to the end.
-- A completed record with a compact key, a digest and a 28-byte result is
-- 64 bytes: the server's default hash-max-listpack-value.
-- The previous release's buckets (o: "#" where b has "$") hold format 2, the
-- same but for a flags byte with 128 added and the fence always I7. The
-- first write into a bucket b moves o's live records into it and leaves o a
-- string (MARKER) with b's TTL, so that a process of the previous release,
-- which would not look in b, fails with WRONGTYPE on every key of the
-- bucket instead of taking a claim beside the record: while b exists, o is
-- that string (both are set by the same scripts, to the same expiry), or
-- with MARK_PREVIOUS off (below) nothing or a marker left earlier.
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
-- WRITE_PREVIOUS (Config.WritePreviousBuckets, for a rolling upgrade): a
-- record whose bucket b does not exist is written into o while o is the
-- previous release's bucket (a hash), in format 2 as that release writes
-- it, instead of moving o into b; so processes of the previous release
-- running meanwhile keep reading and settling what is there.
local WRITE_PREVIOUS = false
-- MARK_PREVIOUS false (Config.PreviousReleaseRetired, once no process of
-- the previous release will run on the prefix again, a rollback included):
-- a bucket's TTL extension deletes k.o instead of leaving the marker there
-- (a key a bucket: ~170–210 bytes of Redis memory), so markers left
-- earlier go too. A previous release's bucket is still read and moved as
-- above.
local MARK_PREVIOUS = true
local BUCKET_VALUE_MAX = 128
local MARKER = 'idem format 3: upgrade'
local HEAD, OFFSET_HEAD = '>BI7BI6I4', '>BI4BI6I4'
-- offsetFence: a value with flags fl holds its fence as an offset (format
-- 3's flag 16; format 2, flag 128, never does).
local function offsetFence(fl)
  return fl < 128 and fl % 32 >= 16
end
-- unpackValue reads a bucket's value of format 3 or 2; room: what flag 8
-- says of the bucket's TTL, else nil.
local function unpackValue(v)
  local fl, f, a, e, age, pos = sbyte(v, 1)
  if offsetFence(fl) then -- a short value may be shorter than HEAD
    local d
    fl, d, a, e, age, pos = sunpack(OFFSET_HEAD, v)
    f = (e - age + 1) * 1000 - d
  else
    fl, f, a, e, age, pos = sunpack(HEAD, v)
    if fl >= 128 then fl = fl - 128 end
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
-- expiresAt: the expiry of a bucket's value (format 3 or 2).
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
  -- o is the previous release's bucket only while b does not exist; b's
  -- expiry (-2: none), asked here, serves save too (k.ttl).
  k.ttl = rcall('PEXPIRETIME', k.b)
  if k.ttl == -2 then
    local ok, w = pcall(rcall, 'HGET', k.o, k.f)
    if ok and w then
      k.ino = true
      return (unpackValue(w)) -- its flag 8 speaks of o's TTL: not used
    end
  end
  local r = stringLoad(k.s)
  k.str = r ~= nil
  return r
end
-- bpack returns r packed for a bucket, or nil where it does not fit one;
-- room: flag 8 (see above); previous: in format 2 (the flags with 128, no
-- 32 for a claim, the fence always I7).
local function bpack(r, room, previous)
  if r.a > 255 or r.f >= 2^56 or r.e - r.u >= 2^32 then return nil end
  local fl, p = r.st, r.p
  if previous then fl = fl + 128 end
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
    mid = spack('>I6B', r.l, r.tag) .. r.n
    if not previous then fl = fl + 32 end
  elseif r.tag == 83 and #r.n >= 4 then
    fl, mid = fl + 32, ssub(r.n, -4)
  end
  local head
  local d = (r.u + 1) * 1000 - r.f
  if not previous and d >= 1 and d < 2^32 then
    head = spack(OFFSET_HEAD, fl + 16, d, r.a, r.e, r.e - r.u)
  else
    head = spack(HEAD, fl, r.f, r.a, r.e, r.e - r.u)
  end
  local v = head .. mid .. p .. r.r
  if #v > BUCKET_VALUE_MAX then return nil end
  return v
end
-- adopt moves the live records of the previous release's bucket k.o, if it
-- is one, into k.b (each value repacked: never longer, so it fits) but for
-- k.f's, written already; deletes k.o and returns the TTL k.b then needs:
-- the latest e + (e - u) of those records (flagged so: the caller sets the
-- TTL to at least that), or o's own expiry if later (0 if no hash). Once per
-- bucket: O(its records).
local function adopt(k, now)
  if rcall('TYPE', k.o).ok ~= 'hash' then return 0 end
  local t = rcall('PEXPIRETIME', k.o)
  local all = rcall('HGETALL', k.o)
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    if f ~= '' and f ~= k.f and expiresAt(v) > now then
      local r = unpackValue(v)
      t = math.max(t, r.e + (r.e - r.u))
      rcall('HSETNX', k.b, f, bpack(r, true))
    end
  end
  rcall('DEL', k.o)
  return t
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
-- savePrevious writes r into the previous release's bucket k.o in format
-- 2 (WRITE_PREVIOUS), as that release's save would (its sweep, its TTL:
-- asked every time, so the value is flagged), and returns the value; false
-- where r does not fit a bucket or k.o is not a hash (a marker outliving b
-- by a moment): then save goes on as usual.
local function savePrevious(k, r, span)
  local v = #k.f <= 64 and bpack(r, true, true)
  if not v then return false end
  local ok, new = pcall(rcall, 'HSET', k.o, k.f, v)
  if not ok then return false end
  if new == 1 and r.f % 8 == 0 then sweepBucket(k.o, r.u) end
  k.ino = true
  if k.str then rcall('DEL', k.s); k.str = false end
  if rcall('PEXPIRETIME', k.o) < r.e + span then
    rcall('PEXPIREAT', k.o, sformat('%d', r.e + 2 * span))
  end
  return v
end
-- save writes r (r.u is now: every transition sets it) where it fits: its
-- bucket, else its own key; and deletes the other copies. The bucket's TTL
-- must stay past r.e: asked with PEXPIRETIME, unless the value r replaces
-- said enough of it (flag 8, k.room) — as it does for the settle of a claim
-- whose retention is no longer than the claim's (the claim's save made the
-- TTL last the claim's retention twice over), which saves the settle a call.
-- A value is flagged when the TTL is known to reach r.e + (r.e - r.u);
-- where the TTL is extended, it is extended to r.e + 2 (r.e - r.u), so that
-- the next writes need not extend it again, and k.o (the previous
-- release's bucket, its records adopted) is made the marker with the same
-- expiry. A bucket just made has no TTL: its first write extends it. A
-- load that did not find the record in b asked b's expiry already (k.ttl):
-- nothing between changes it but this HSET, which can only make b (-2, and
-- then no TTL: both extend).
save = function(k, r)
  local span = r.e - r.u
  -- k.ttl is -2 where load asked and b does not exist (see load).
  local v = WRITE_PREVIOUS and k.ttl == -2 and savePrevious(k, r, span)
  if v then return v end
  local ask, room = true, true
  if k.room and r.e <= k.room then
    ask, room = false, r.e + span <= k.room
  end
  v = #k.f <= 64 and bpack(r, room)
  if not v then
    if k.inb then rcall('HDEL', k.b, k.f); k.inb = false end
    if k.ino then rcall('HDEL', k.o, k.f); k.ino = false end
    k.str = true
    return stringSave(k.s, r)
  end
  -- One new field in eight (by its fence: not by the key, which a workload
  -- may end alike every time) checks the sweep time.
  if rcall('HSET', k.b, k.f, v) == 1 and r.f % 8 == 0 then sweepBucket(k.b, r.u) end
  k.inb = true
  if k.str then rcall('DEL', k.s); k.str = false end
  if ask and (k.ttl or rcall('PEXPIRETIME', k.b)) < r.e + span then
    local t = math.max(r.e + 2 * span, adopt(k, r.u))
    t = sformat('%d', t) -- see record.lua's save
    rcall('PEXPIREAT', k.b, t)
    if MARK_PREVIOUS then
      rcall('SET', k.o, MARKER, 'PXAT', t)
    else
      rcall('DEL', k.o) -- adopt moved it if it was a bucket: a marker, or nothing
    end
  end
  return v
end
-- remove deletes the record of k from its bucket, its own key and the
-- previous release's bucket (where that is still a hash).
remove = function(k)
  rcall('HDEL', k.b, k.f)
  pcall(rcall, 'HDEL', k.o, k.f)
  rcall('DEL', k.s)
end
-- sameCall: the nonce of a settle's record is the call's (a bucket keeps
-- its last four bytes).
sameCall = function(stored, nonce)
  return stored == nonce or (#stored == 4 and stored == ssub(nonce, -4))
end
