package testenv

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/store"
)

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
