package redisstore_test

import (
	"testing"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/storetest"
)

func TestOutageFailsClosedAndRecovers(t *testing.T) {
	p := testenv.RedisProxy(t)
	s := testenv.OpenRedisAt(t, p.Addr(), testenv.RandomName("idemtest:")+":")
	storetest.Outage(t, s, p.Cut, p.Restore)
}

func TestLeaseRunsOutInAnOutage(t *testing.T) {
	p := testenv.RedisProxy(t)
	prefix := testenv.RandomName("idemtest:") + ":"
	s := testenv.OpenRedisAt(t, p.Addr(), prefix)
	storetest.LeaseRunsOutInAnOutage(t, s, testenv.OpenRedis(t, prefix), p.Cut, p.Restore)
}

func TestSettleAcrossABlip(t *testing.T) {
	p := testenv.RedisProxy(t)
	storetest.SettleAcrossABlip(t, testenv.OpenRedisAt(t, p.Addr(), testenv.RandomName("idemtest:")+":"), p.Cut, p.Restore)
}
