package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/idemgo/idem/store/storetest"
)

// TestSentinel runs on a real Redis master with a replica and three
// Sentinels, through go-redis's FailoverClient: the conformance suite, then
// a failover — the master killed with SIGKILL mid-run.
func TestSentinel(t *testing.T) {
	sentinel := testenv.StartRedisSentinel(t)
	open := func(t testing.TB) *redisstore.Store {
		s, err := redisstore.New(redisstore.Config{Client: sentinel.Client(t), Prefix: testenv.RandomName("idemtest:") + ":"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, storetest.Capabilities{ListsRecords: true, SelfExpiring: true}, func(t testing.TB) idem.Store { return open(t) })
	})
	t.Run("FailoverFailsClosedThenResumes", func(t *testing.T) {
		s := open(t)
		g, err := idem.NewGuard(idem.Config{Store: s, Lease: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var done []string // completions acknowledged to the caller
		runs := map[string]int{}
		lifecycle := func(i int) error {
			id := fmt.Sprintf("pay-%05d", i)
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := g.Run(cctx, idem.Key{Scope: "failover", ID: id}, nil, func(context.Context, uint64) ([]byte, error) {
				runs[id]++
				return []byte("ok"), nil
			})
			if err == nil {
				done = append(done, id)
			}
			return err
		}
		for i := range 200 {
			if err := lifecycle(i); err != nil {
				t.Fatal(err)
			}
		}
		sentinel.KillMaster(t)
		killed := time.Now()
		var failures int
		var recovered time.Duration
		for i := 200; ; i++ {
			err := lifecycle(i)
			if err == nil {
				if recovered == 0 {
					recovered = time.Since(killed)
				}
				if i > 400 && recovered > 0 {
					break
				}
				continue
			}
			failures++
			if !errors.Is(err, idem.ErrStoreUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a failure during the failover that is not 'unavailable': %v", err)
			}
			if time.Since(killed) > 60*time.Second {
				t.Fatalf("no recovery 60s after the master was killed (%d failures)", failures)
			}
		}
		for id, n := range runs {
			if n > 1 {
				t.Fatalf("%s ran %d times", id, n)
			}
		}
		// What the promoted replica lost of the acknowledged completions
		// (replication is asynchronous).
		lost := 0
		for _, id := range done {
			if _, err := s.Get(ctx, g.StorageKey(idem.Key{Scope: "failover", ID: id})); errors.Is(err, idem.ErrNotFound) {
				lost++
			}
		}
		t.Logf("failover: %d calls failed closed, recovered %v after the SIGKILL, %d of %d acknowledged completions lost (no WAIT)",
			failures, recovered.Round(time.Millisecond), lost, len(done))
	})
}
