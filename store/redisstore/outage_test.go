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
