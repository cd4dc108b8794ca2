package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/store"
)

// ServerCrash writes to s — claims (one by one, and by goroutines at once:
// shared round trips), completions, heartbeats, releases, deletes, and
// where s has them archives, unclaims and fenced deletes — 200 of each
// kind, crashes the store's server with crash after each kind, and fails t
// if any write s acknowledged is lost: every call after the restart fails
// closed (ErrStoreUnavailable) until s reconnects, then every key reads as
// acknowledged. name prefixes its log lines.
func ServerCrash(t *testing.T, s store.Store, crash func(), name string) {
	ctx := context.Background()
	archiver, _ := s.(store.StoredArchiver)
	unclaimer, _ := s.(store.Unclaimer)
	fenced, _ := s.(store.FencedDeleter)
	key := func(i int) string { return fmt.Sprintf("k%05d", i) }
	// want says what each key written so far must be.
	type expect struct {
		state      store.State // completed, released, or in flight with a lease
		leaseFloor time.Time   // lasting at least until then
		absent     bool        // deleted
	}
	completed := expect{state: store.StateCompleted}
	claimed := func() expect {
		return expect{state: store.StateInFlight, leaseFloor: time.Now().Add(30 * time.Minute)}
	}
	released := func() expect { return expect{state: store.StateReleased} }
	deleted := func() expect { return expect{absent: true} }
	want := map[string]expect{}
	// claimAll claims keys one by one and returns their fences.
	claimAll := func(keys []string, lease time.Duration) []uint64 {
		fences := make([]uint64, len(keys))
		for j, k := range keys {
			a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: lease, Retention: time.Hour})
			if err == nil && a.Outcome != store.Acquired {
				err = fmt.Errorf("%s: %v", k, a.Outcome)
			}
			if err != nil {
				t.Fatal(err)
			}
			fences[j] = a.Fence
		}
		return fences
	}
	// claimThen claims keys, calls op on each with its fence, and then
	// expects what w says of each.
	claimThen := func(keys []string, lease time.Duration, op func(k string, fence uint64) error, w func() expect) {
		fences := claimAll(keys, lease)
		for j, k := range keys {
			if err := op(k, fences[j]); err != nil {
				t.Fatal(err)
			}
			want[k] = w()
		}
	}
	const n = 200
	next := 2000
	CompleteMany(t, s, next, key)
	for i := range next {
		want[key(i)] = completed
	}
	for _, phase := range []struct {
		kind  string
		write func(keys []string)
	}{
		{"claims", func(keys []string) {
			claimAll(keys, time.Hour)
			for _, k := range keys {
				want[k] = claimed()
			}
		}},
		{"claims by many goroutines", func(keys []string) { // coalesced acquisitions
			var wg sync.WaitGroup
			errs := make([]error, len(keys))
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := g; j < len(keys); j += 8 {
						a, err := s.Acquire(ctx, store.AcquireRequest{Key: keys[j], Lease: time.Hour, Retention: time.Hour})
						if err == nil && a.Outcome != store.Acquired {
							err = fmt.Errorf("%s: %v", keys[j], a.Outcome)
						}
						errs[j] = err
					}
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				want[k] = claimed()
			}
		}},
		{"completions", func(keys []string) {
			fences := claimAll(keys, time.Hour)
			var wg sync.WaitGroup
			errs := make([]error, len(keys))
			for g := range 8 { // coalesced statements too
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := g; j < len(keys); j += 8 {
						errs[j] = s.Complete(ctx, keys[j], fences[j], []byte("done"), time.Hour)
					}
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				want[k] = completed
			}
		}},
		{"heartbeats", func(keys []string) {
			claimThen(keys, time.Minute, func(k string, fence uint64) error {
				return s.Heartbeat(ctx, k, fence, time.Hour)
			}, claimed)
		}},
		{"archives", func(keys []string) {
			for _, k := range keys {
				rec := store.Record{Key: k, State: store.StateCompleted, Fence: 1, Attempts: 1, Result: []byte("archived")}
				if stored, err := archiver.ArchiveStored(ctx, rec, time.Hour); err != nil || !stored {
					t.Fatalf("archive %s: stored %v, %v", k, stored, err)
				}
				want[k] = completed
			}
		}},
		// A lost release keeps the key in flight until its lease ends (the
		// retry waits); a lost delete brings the record back (a duplicate
		// is answered from it instead of running anew).
		{"releases", func(keys []string) {
			claimThen(keys, time.Hour, func(k string, fence uint64) error { return s.Release(ctx, k, fence) }, released)
		}},
		{"deletes", func(keys []string) {
			CompleteMany(t, s, len(keys), func(j int) string { return keys[j] })
			for _, k := range keys {
				if err := s.Delete(ctx, k); err != nil {
					t.Fatal(err)
				}
				want[k] = deleted()
			}
		}},
		// The tiered store's own: an unclaim gives back a claim under
		// which nothing ran (lost: in flight until the lease ends), a
		// fenced delete drops a claim (lost: the record comes back).
		{"unclaims", func(keys []string) {
			claimThen(keys, time.Hour, func(k string, fence uint64) error { return unclaimer.Unclaim(ctx, k, fence) }, released)
		}},
		{"fenced deletes", func(keys []string) {
			claimThen(keys, time.Hour, func(k string, fence uint64) error { return fenced.DeleteUpTo(ctx, k, fence) }, deleted)
		}},
	} {
		if phase.kind == "archives" && archiver == nil || phase.kind == "unclaims" && unclaimer == nil || phase.kind == "fenced deletes" && fenced == nil {
			continue
		}
		keys := make([]string, n)
		for j := range keys {
			keys[j] = key(next + j)
		}
		next += n
		phase.write(keys)
		crash()

		// The pool's connections died with the server: calls fail closed
		// until it has new ones, then the same Store answers.
		failed := 0
		eventually(t, 30*time.Second, "the store answers after the restart", func() error {
			_, err := s.Get(ctx, key(0))
			if err != nil && !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("a call after the restart: %v, want ErrStoreUnavailable until the store reconnects", err)
			}
			if err != nil {
				failed++
			}
			return err
		})
		var lost []string
		for k, w := range want {
			r, err := s.Get(ctx, k)
			switch {
			case errors.Is(err, store.ErrNotFound):
				if !w.absent {
					lost = append(lost, k)
				}
			case err != nil:
				t.Fatal(err)
			case w.absent, r.State != w.state, r.LeaseUntil.Before(w.leaseFloor):
				lost = append(lost, k)
			}
		}
		t.Logf("%s: crash after %d %s: %d calls failed closed after the restart; %d of %d acknowledged writes lost",
			name, n, phase.kind, failed, len(lost), len(want))
		if len(lost) > 0 {
			slices.Sort(lost)
			t.Fatalf("crash after %d %s: lost %d acknowledged writes to a SIGKILL of the server (keys %s … %s)",
				n, phase.kind, len(lost), lost[0], lost[len(lost)-1])
		}
	}
}

// CompleteMany acquires and completes n records in s, 16 at once; key(i)
// is the storage key of record i.
func CompleteMany(t testing.TB, s store.Store, n int, key func(i int) string) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				k := key(i)
				a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Hour})
				if err == nil {
					err = s.Complete(ctx, k, a.Fence, []byte("ok"), time.Hour)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// eventually polls cond every 20 ms until it returns nil, failing t with
// its last error after timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for err := cond(); err != nil; err = cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
