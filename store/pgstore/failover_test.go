package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/pgstore"
)

// TestFailover: a primary with a synchronous standby (named in its
// synchronous_standby_names) is killed with SIGKILL and the standby
// promoted, as a failover manager does. No claim acknowledged before the
// kill may be missing on the new primary — a lost claim lets a second
// owner run the key beside the first — whatever the sessions'
// synchronous_commit: "local" and "off" commit without waiting for the
// standby. To make the loss certain rather than a race with the standby's
// streaming, the standby is parted from the primary while eight goroutines
// claim new keys (testenv.FailOver).
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

			acked, parted := testenv.FailOver(t, primary, standby, link, func(ctx context.Context, k string) bool {
				a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Hour, Retention: time.Hour})
				if err == nil && a.Outcome != store.Acquired {
					t.Errorf("%s: %v", k, a.Outcome)
				}
				return err == nil
			})

			after, err := pgstore.Open(ctx, pgstore.Config{ConnString: standby.URL, Schema: "idem"})
			if err != nil {
				t.Fatal(err)
			}
			defer after.Close()
			var lost []string
			for _, k := range acked {
				r, err := after.Get(ctx, k)
				if errors.Is(err, store.ErrNotFound) || err == nil && r.State != store.StateInFlight {
					lost = append(lost, k)
				} else if err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%s: %d claims acknowledged (%d while the standby was parted), %d lost to the failover",
				c.name, len(acked), parted, len(lost))
			if len(lost) > 0 {
				t.Fatalf("lost %d of %d acknowledged claims to a failover to the synchronous standby (first %s)", len(lost), len(acked), lost[0])
			}
		})
	}
}
