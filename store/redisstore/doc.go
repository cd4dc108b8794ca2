// Package redisstore is the Redis store.Store, on go-redis v9: a hot shared
// store whose records expire by themselves.
//
// It takes a redis.UniversalClient, so a single node, Sentinel and Cluster
// all work. Each record is one string — state, fence, attempts, times, the
// nonce of its last call, the fingerprint (16 bytes for idem's digests) and
// the result, packed (record.lua) — whose name carries a hash tag ({storage
// key}), so everything a record needs sits in one Cluster slot. Each
// transition is one call of a Redis function (FCALL; the store loads its
// library, FUNCTION LOAD, where a call finds it missing, and idem migrate
// loads it on every master) or, where the server has no functions or the
// ACL denies them, or with Config.NoFunctions, of the same Lua as a script
// (EVALSHA, falling back to EVAL when the server does not have it cached).
// Times come from the server (TIME), and every key gets a TTL (PXAT at the
// record's expiry): no key lives forever, and Sweep has nothing to do.
//
// With Config.Buckets, records live many to a hash instead (bucket.lua): a
// bucket in the slot of its records' own key names, a packed value per
// record under its key's field, ~95 bytes per completed record (a compact
// key, a 28-byte result) where a key per record takes 257. Each bucket
// deletes its own expired records and has a TTL past its last one, so
// Sweep has nothing to do there either.
package redisstore
