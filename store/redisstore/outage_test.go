package redisstore_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/idemgo/idem/store/storetest"
)

func TestOutageFailsClosedAndRecovers(t *testing.T) {
	testenv.RedisClient(t).Close()
	opt, err := redis.ParseURL(testenv.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	p := testenv.StartProxy(t, opt.Addr)
	opt.Addr = p.Addr()
	c := redis.NewClient(opt)
	defer c.Close()
	s, err := redisstore.New(redisstore.Config{Client: c, Prefix: testenv.RandomName("idemtest:") + ":"})
	if err != nil {
		t.Fatal(err)
	}
	storetest.Outage(t, s, p.Cut, p.Restore)
}
