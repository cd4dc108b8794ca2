package dynamostore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
)

// TestServerCrash kills a dynalite of the test's own with SIGKILL after 300
// acknowledged completions and a claim still held, and starts it again on
// its files. While it is down every call fails closed
// (store.ErrUnavailable); once it is back the same store, not reopened,
// serves again: every completion is there with its result, the held claim
// still holds its key, and the key's next fence is above every fence handed
// out before the crash.
func TestServerCrash(t *testing.T) {
	srv := testenv.StartDynalite(t)
	table := testenv.RandomName("idem_crash_")
	s := openAt(t, table+" "+srv.Endpoint)
	ctx := context.Background()
	const n = 300
	var top uint64
	for i := range n {
		k := fmt.Sprintf("k%04d", i)
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Hour})
		if err == nil {
			err = s.Complete(ctx, k, a.Fence, []byte("r-"+k), time.Hour)
		}
		if err != nil {
			t.Fatal(err)
		}
		top = max(top, a.Fence)
	}
	held, err := s.Acquire(ctx, store.AcquireRequest{Key: "held", Lease: time.Hour, Retention: time.Hour})
	if err != nil || held.Outcome != store.Acquired {
		t.Fatalf("the held claim: %+v %v", held, err)
	}

	srv.Kill()
	for _, k := range []string{"k0000", "new", "held"} {
		_, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Hour})
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("acquire %s with the server down: %v, want store.ErrUnavailable", k, err)
		}
	}
	if err := s.Complete(ctx, "held", held.Fence, []byte("late"), time.Hour); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("complete with the server down: %v, want store.ErrUnavailable", err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}

	testenv.Eventually(t, 10*time.Second, "the store serves again", func() error {
		_, err := s.Get(ctx, "k0000")
		return err
	})
	for i := range n {
		k := fmt.Sprintf("k%04d", i)
		r, err := s.Get(ctx, k)
		if err != nil {
			t.Fatalf("%s after the crash: %v", k, err)
		}
		if r.State != store.StateCompleted || string(r.Result) != "r-"+k {
			t.Fatalf("%s after the crash: %+v", k, r)
		}
	}
	again, err := s.Acquire(ctx, store.AcquireRequest{Key: "held", Lease: time.Minute, Retention: time.Hour})
	if err != nil || again.Outcome != store.InProgress {
		t.Fatalf("the held key after the crash: %+v %v, want in progress", again, err)
	}
	if err := s.Complete(ctx, "held", held.Fence, []byte("done"), time.Hour); err != nil {
		t.Fatalf("the holder settles after the crash: %v", err)
	}
	if err := s.Delete(ctx, "k0000"); err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(ctx, store.AcquireRequest{Key: "k0000", Lease: time.Minute, Retention: time.Hour})
	if err != nil || a.Outcome != store.Acquired || a.Fence <= top {
		t.Fatalf("a deleted key after the crash: %+v %v, want acquired above fence %d", a, err, top)
	}
}
