package ctxsleep

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleepEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep on an ended context: %v, want context.Canceled", err)
	}
}

func TestSleepWaits(t *testing.T) {
	start := time.Now()
	if err := Sleep(context.Background(), 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 20*time.Millisecond {
		t.Fatalf("Sleep(20ms) returned after %v", waited)
	}
}

// TestRetryStopsAtTheDeadline: Retry calls again while try asks and the
// next pause ends before the deadline; it stops when try is done, and
// never pauses past the deadline.
func TestRetryStopsAtTheDeadline(t *testing.T) {
	calls := 0
	Retry(context.Background(), func() time.Time { return time.Now().Add(time.Hour) }, func() bool { calls++; return calls < 3 })
	if calls != 3 {
		t.Fatalf("called %d times, want 3 (until try is done)", calls)
	}
	calls = 0
	Retry(context.Background(), func() time.Time { return time.Now().Add(5 * time.Millisecond) }, func() bool { calls++; return true })
	if calls != 1 {
		t.Fatalf("called %d times, want 1 (the first pause, 10 ms, ends past the deadline)", calls)
	}
	calls = 0
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	Retry(ctx, func() time.Time { return time.Now().Add(time.Hour) }, func() bool { calls++; return true })
	if calls != 1 {
		t.Fatalf("called %d times with the context ended, want 1", calls)
	}
}

// TestRetryPausingStopsGrowingAtLongest: eight tries with the pauses held
// at 10 ms take well under a second; Retry's doubling pauses would take
// 1.27 s (10 + 20 + … + 640 ms).
func TestRetryPausingStopsGrowingAtLongest(t *testing.T) {
	calls := 0
	start := time.Now()
	RetryPausing(context.Background(), func() time.Time { return time.Now().Add(time.Hour) }, 10*time.Millisecond,
		func() bool { calls++; return calls < 8 })
	if calls != 8 {
		t.Fatalf("called %d times, want 8", calls)
	}
	if took := time.Since(start); took >= 1270*time.Millisecond {
		t.Fatalf("eight tries took %v: the pauses grew past 10 ms", took)
	}
}
