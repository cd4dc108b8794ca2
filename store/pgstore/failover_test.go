package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/pgstore"
)

// TestFailover: a primary with a synchronous standby (named in its
// synchronous_standby_names) is killed with SIGKILL and the standby
// promoted, as a failover manager does. No claim acknowledged before the
// kill may be missing on the new primary — a lost claim lets a second
// owner run the key beside the first — whatever the sessions'
// synchronous_commit: "local" and "off" commit without waiting for the
// standby. To make the loss certain rather than a race with the standby's
// streaming, the standby is parted from the primary (the connection it
// streams over cut) while eight goroutines claim new keys: a claim that
// waits for the standby is never acknowledged, one that does not wait is
// acknowledged and then lost.
func TestFailover(t *testing.T) {
	ctx := context.Background()
	testenv.ProbePostgres(t)
	for _, c := range []struct {
		name, setting string
		usersPool     bool
	}{
		{"server default synchronous_commit on", "on", false},
		{"server default synchronous_commit local", "local", false},
		{"server default synchronous_commit local, a pool of the user's", "local", true},
		{"server default synchronous_commit off, a pool of the user's", "off", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			primary := testenv.StartPostgres(t, "synchronous_commit="+c.setting, "synchronous_standby_names=s1")
			standby, link := primary.StartStandby(t, "s1")
			cfg := pgstore.Config{ConnString: primary.URL, Schema: "idem"}
			if c.usersPool {
				pool, err := pgxpool.New(ctx, primary.URL)
				if err != nil {
					t.Fatal(err)
				}
				defer pool.Close()
				cfg = pgstore.Config{Pool: pool, Schema: "idem"}
			}
			s, err := pgstore.Open(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()

			var mu sync.Mutex
			var acked []string
			claim := func(ctx context.Context, k string) {
				a, err := s.Acquire(ctx, idem.AcquireRequest{Key: k, Lease: time.Hour, Retention: time.Hour})
				if err == nil && a.Outcome != idem.Acquired {
					t.Errorf("%s: %v", k, a.Outcome)
				}
				if err == nil {
					mu.Lock()
					acked = append(acked, k)
					mu.Unlock()
				}
			}
			for i := range 100 {
				claim(ctx, fmt.Sprintf("before%03d", i))
			}
			if len(acked) != 100 {
				t.Fatalf("%d of 100 claims acknowledged with the standby streaming", len(acked))
			}

			link.Cut() // the standby parted from its primary
			writing, stop := context.WithCancel(ctx)
			var next atomic.Int64
			var wg sync.WaitGroup
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for writing.Err() == nil {
						claim(writing, fmt.Sprintf("parted%05d", next.Add(1)))
					}
				}()
			}
			time.Sleep(300 * time.Millisecond) // the window of claims made while they are parted
			stop()
			wg.Wait()
			primary.Kill()
			standby.Promote(t)

			after, err := pgstore.Open(ctx, pgstore.Config{ConnString: standby.URL, Schema: "idem"})
			if err != nil {
				t.Fatal(err)
			}
			defer after.Close()
			var lost []string
			for _, k := range acked {
				r, err := after.Get(ctx, k)
				if errors.Is(err, idem.ErrNotFound) || err == nil && r.State != idem.StateInFlight {
					lost = append(lost, k)
				} else if err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%s: %d claims acknowledged (%d while the standby was parted), %d lost to the failover",
				c.name, len(acked), len(acked)-100, len(lost))
			if len(lost) > 0 {
				t.Fatalf("lost %d of %d acknowledged claims to a failover to the synchronous standby (first %s)", len(lost), len(acked), lost[0])
			}
		})
	}
}
