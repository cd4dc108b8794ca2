-- idem record encoding, shared by the acquire and owned scripts. A record is
-- one string (format 1), packed big-endian:
--   B format (1), B state, I8 fence, I4 attempts, I6 lease until (ms),
--   I6 expires at (ms), I6 updated at (ms), B tag, B+bytes nonce,
--   B+bytes fingerprint, then the result to the end of the string.
-- The tag says what the nonce did: 49 ('1') or 50 ('2') the claim it took
-- (Acquired or TakenOver), 83 ('S') the settle. The fingerprint is as the
-- client encodes it (1 + 16 bytes for a 32-digit hex digest, 0 + the string
-- otherwise). The key's TTL is the expiry (PXAT).
-- The library functions the scripts call, as locals: a global's lookup is
-- two table reads on every call (~0.5 µs of a bucket lifecycle's ~25 µs of
-- server CPU; docs/benchmarks.md).
local sbyte, ssub, schar, sformat = string.byte, string.sub, string.char, string.format
local spack, sunpack, rcall = struct.pack, struct.unpack, redis.call
local FMT = '>BBI8I4I6I6I6BBc0Bc0'
local function load(k)
  local v = rcall('GET', k)
  if not v then return nil end
  local _, st, f, a, l, e, u, tag, n, p, pos = sunpack(FMT, v)
  return {st = st, f = f, a = a, l = l, e = e, u = u, tag = tag, n = n, p = p, r = ssub(v, pos), raw = v}
end
local function pack(r)
  return spack(FMT, 1, r.st, r.f, r.a, r.l, r.e, r.u, r.tag, #r.n, r.n, #r.p, r.p) .. r.r
end
-- save writes r with its expiry as the key's TTL and returns what it wrote.
-- A number passed to redis.call is formatted with %.17g (a few thousand
-- instructions of glibc's floating-point printing); an expiry is a whole
-- number of ms, written with %d instead.
local function save(k, r)
  local v = pack(r)
  rcall('SET', k, v, 'PXAT', sformat('%d', r.e))
  return v
end
-- remove deletes the record at k.
local function remove(k)
  rcall('DEL', k)
end
-- sameCall: the nonce a record keeps is the one of the call at hand.
local function sameCall(stored, nonce)
  return stored == nonce
end
-- packed returns r as stored (unchanged records are answered as read).
local function packed(r)
  return r.raw or pack(r)
end
