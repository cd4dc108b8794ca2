package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/idemgo/idem/store"
)

// KeysReadBack completes a record under each of keys with fingerprint fp
// and reads it back: its key, fingerprint and state as written. For a
// backend's tests of keys that its layout keeps in a form of its own
// (packed, binary), beside what the suite covers.
func KeysReadBack(t testing.TB, s store.Store, fp string, keys ...string) {
	t.Helper()
	ctx := context.Background()
	for _, key := range keys {
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: key, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour})
		if err != nil || a.Outcome != store.Acquired {
			t.Fatalf("%q: %+v %v", key, a, err)
		}
		if err := s.Complete(ctx, key, a.Fence, []byte("done"), time.Hour); err != nil {
			t.Fatalf("%q: %v", key, err)
		}
		rec, err := s.Get(ctx, key)
		if err != nil || rec.Key != key || rec.Fingerprint != fp || rec.State != store.StateCompleted {
			t.Fatalf("%q read back: %+v %v", key, rec, err)
		}
	}
}
