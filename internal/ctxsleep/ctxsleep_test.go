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
// deadline lasts; it stops when try is done, never pauses past the
// deadline, and cuts a pause short for a last call there only once.
func TestRetryStopsAtTheDeadline(t *testing.T) {
	calls := 0
	Retry(context.Background(), func() time.Time { return time.Now().Add(time.Hour) }, func() bool { calls++; return calls < 3 })
	if calls != 3 {
		t.Fatalf("called %d times, want 3 (until try is done)", calls)
	}
	calls = 0
	Retry(context.Background(), func() time.Time { return time.Now().Add(5 * time.Millisecond) }, func() bool { calls++; return true })
	if calls != 2 {
		t.Fatalf("called %d times, want 2 (the first pause, 10 ms, ends past the deadline: cut to it, for a last call; then no more)", calls)
	}
	calls = 0
	Retry(context.Background(), func() time.Time { return time.Now().Add(-time.Millisecond) }, func() bool { calls++; return true })
	if calls != 1 {
		t.Fatalf("called %d times with the deadline passed, want 1", calls)
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

// TestRetryTriesLastAtTheDeadline: a pause that would end past the
// deadline is cut to end there, for one last call, so a caller retrying
// until a lease ends uses the whole lease. With a deadline 300 ms away the
// doubling pauses (10, 20, 40, 80 ms) bring the fifth call at 150 ms; the
// next pause, 160 ms, is cut to 150: the sixth call comes at the deadline.
func TestRetryTriesLastAtTheDeadline(t *testing.T) {
	start := time.Now()
	deadline := start.Add(300 * time.Millisecond)
	var last time.Time
	calls := 0
	Retry(context.Background(), func() time.Time { return deadline }, func() bool { calls++; last = time.Now(); return true })
	if last.Before(deadline.Add(-30 * time.Millisecond)) {
		t.Fatalf("the last of %d calls came %v before the deadline", calls, deadline.Sub(last))
	}
}

func TestUntilWakes(t *testing.T) {
	wake := make(chan struct{})
	close(wake)
	if err := Until(context.Background(), wake, time.Hour); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Until(ctx, make(chan struct{}), time.Hour); err == nil {
		t.Fatal("a cancelled context did not end the wait")
	}
}
