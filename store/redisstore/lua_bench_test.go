package redisstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/redisstore"
)

// BenchmarkLuaLifecycle runs b.N lifecycles (acquire a fresh key, complete
// it) inside Redis, in one EVAL looping over the scripts' own functions, so
// no client or network is measured: "µs-in-redis/lifecycle" is the server's
// time per lifecycle, with a key per record and in buckets (16,384 buckets:
// at 500,000 lifecycles, -benchtime 500000x, about 30 records per bucket).
// The loop makes each lifecycle's key names itself, where a script gets
// them from its call (KEYS): a first loop makes the names alone, and its
// time is taken off ("µs-names/lifecycle": a bucket's names cost more than
// one key's, which is not the scripts' work).
func BenchmarkLuaLifecycle(b *testing.B) {
	p := redisstore.LuaParts
	for _, layout := range []struct {
		name, lua, key string
	}{
		{"key-per-record", p.Record, "local k = prefix .. '{' .. i .. '}'"},
		{"buckets", p.Record + p.Bucket, "local k = {s = prefix .. '{' .. i .. '}', b = prefix .. 'b' .. (i % 16384), o = prefix .. 'o' .. (i % 16384), f = string.format('%016d', i)}"},
	} {
		b.Run(layout.name, func(b *testing.B) {
			s := testenv.OpenRedis(b, testenv.RandomName("idemtest:")+":")
			script := layout.lua + p.Acquire + p.Owned + p.Clock + fmt.Sprintf(`
local prefix = ARGV[1]
local fp, result = '\1' .. string.rep('a', 16), string.rep('r', 28)
local function since(t0)
  local t1 = redis.call('TIME')
  return (tonumber(t1[1]) - tonumber(t0[1])) * 1000000 + tonumber(t1[2]) - tonumber(t0[2])
end
local t0 = redis.call('TIME')
for i = 1, %[1]d do
  %[2]s -- made, not used: Redis's Lua does not optimise it away
end
local names = since(t0)
collectgarbage() -- the names made: not the lifecycles' to collect
t0 = redis.call('TIME')
for i = 1, %[1]d do
  %[2]s
  -- Each key is fresh and takes the clock's µs as its fence, as a claim
  -- does (so a bucket stores it in its short form).
  acquire(k, fp, 60000, 3600000, 0, string.format('nonce%%05d', i %% 100000), now, floor)
  if owned(k, 'c', string.format('%%d', floor), 3600000, result, 'settle-non', now) ~= 1 then
    return redis.error_reply('complete refused')
  end
end
return {since(t0), names}
`, b.N, layout.key)
			opt := *s.Client().(*redis.Client).Options()
			opt.ReadTimeout = -1 // the one EVAL runs for seconds
			c := redis.NewClient(&opt)
			defer c.Close()
			b.ResetTimer()
			us, err := c.Eval(context.Background(), script, nil, s.KeyName("")[:len(s.KeyName(""))-2]).Int64Slice()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(us[0]-us[1])/float64(b.N), "µs-in-redis/lifecycle")
			b.ReportMetric(float64(us[1])/float64(b.N), "µs-names/lifecycle")
		})
	}
}
