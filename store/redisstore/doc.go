// Package redisstore is the Redis idem.Store, on go-redis v9: a hot shared
// store whose records expire by themselves.
//
// It takes a redis.UniversalClient, so a single node, Sentinel and Cluster
// all work. Each record is one hash whose name carries a hash tag
// ({storage key}), so everything a record needs sits in one Cluster slot.
// Each transition is one Lua script (EVALSHA, falling back to EVAL when the
// server does not have it cached), times come from the server (TIME), and
// every key gets a TTL (PEXPIREAT at the record's expiry): no key lives
// forever, and Sweep has nothing to do.
package redisstore
