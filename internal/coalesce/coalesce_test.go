package coalesce

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// echo is a Group whose round trips answer each request with itself,
// recording the batches.
type echo struct {
	mu      sync.Mutex
	singles []string
	batches [][]string
	gate    chan struct{} // when set, the first single call waits on it
	gated   chan struct{} // closed when the gated call has started
	batchFn func(ctx context.Context, reqs []string, resps []string, errs []error)
}

func newEcho(cfg Config[string]) (*echo, *Group[string, string]) {
	e := &echo{}
	g := New(cfg, func(ctx context.Context, req string) (string, error) {
		e.mu.Lock()
		e.singles = append(e.singles, req)
		gate := e.gate
		e.gate = nil
		e.mu.Unlock()
		if gate != nil {
			close(e.gated)
			<-gate
		}
		if err := ctx.Err(); err != nil {
			return "", err
		}
		return "re:" + req, nil
	}, func(ctx context.Context, reqs []string, resps []string, errs []error) {
		e.mu.Lock()
		e.batches = append(e.batches, append([]string(nil), reqs...))
		fn := e.batchFn
		e.mu.Unlock()
		if fn != nil {
			fn(ctx, reqs, resps, errs)
			return
		}
		for i, r := range reqs {
			resps[i] = "re:" + r
		}
	})
	return e, g
}

// hold makes the next single call wait until the returned release is called.
func (e *echo) hold() (started <-chan struct{}, release func()) {
	gate := make(chan struct{})
	e.mu.Lock()
	e.gate, e.gated = gate, make(chan struct{})
	started = e.gated
	e.mu.Unlock()
	return started, func() { close(gate) }
}

func (g *Group[Req, Resp]) waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

// waitQueued waits until n calls are queued (the queue changes only under
// the Group's lock; the test polls it, for the calls give no other signal
// of having joined it).
func waitQueued[Req, Resp any](t *testing.T, g *Group[Req, Resp], n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for g.waiting() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", g.waiting(), n)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func TestALoneCallRunsAloneAtOnce(t *testing.T) {
	e, g := newEcho(Config[string]{})
	for i := range 100 {
		got, err := g.Do(context.Background(), fmt.Sprint(i))
		if err != nil || got != fmt.Sprintf("re:%d", i) {
			t.Fatalf("call %d: %q %v", i, got, err)
		}
	}
	if len(e.singles) != 100 || len(e.batches) != 0 {
		t.Fatalf("sequential calls: %d single, %d batches; want 100 single, none batched", len(e.singles), len(e.batches))
	}
}

// TestWaitingCallsShareTheNextRoundTrip: with one round trip in flight, 99
// calls queue; when it ends they run in batches of at most MaxBatch, and
// every caller gets its own answer.
func TestWaitingCallsShareTheNextRoundTrip(t *testing.T) {
	e, g := newEcho(Config[string]{MaxBatch: 40, MaxInFlight: 1})
	started, release := e.hold()
	var wg sync.WaitGroup
	results := make([]string, 100)
	errs := make([]error, 100)
	do := func(i int) {
		defer wg.Done()
		results[i], errs[i] = g.Do(context.Background(), fmt.Sprint(i))
	}
	wg.Add(1)
	go do(0)
	<-started
	for i := 1; i < 100; i++ {
		wg.Add(1)
		go do(i)
	}
	waitQueued(t, g, 99)
	release()
	wg.Wait()
	for i := range 100 {
		if errs[i] != nil || results[i] != fmt.Sprintf("re:%d", i) {
			t.Errorf("call %d: %q %v", i, results[i], errs[i])
		}
	}
	if len(e.singles) != 1 {
		t.Errorf("%d single calls, want 1 (the one in flight)", len(e.singles))
	}
	var sizes []int
	total := 0
	for _, b := range e.batches {
		sizes = append(sizes, len(b))
		total += len(b)
	}
	if fmt.Sprint(sizes) != "[40 40 19]" || total != 99 {
		t.Errorf("batch sizes %v, want [40 40 19]", sizes)
	}
	if b, r := g.Stats(); b != 3 || r != 99 {
		t.Errorf("Stats() = %d, %d; want 3, 99", b, r)
	}
}

// TestUnderLoadACallWaitsForABatch: while the group is loaded (LoadedAt
// requests in it: here one, the call in flight) and LoneInFlight round
// trips are out, a call waits instead of running alone, though slots are
// free; the queue goes out as soon as it is MinBatch long, beside the round
// trip still in flight.
func TestUnderLoadACallWaitsForABatch(t *testing.T) {
	e, g := newEcho(Config[string]{MaxInFlight: 4, LoneInFlight: 1, MinBatch: 2, LoadedAt: 1})
	aCallWaitsForABatch(t, e, g)
	if singles := fmt.Sprint(e.singles); singles != "[1]" {
		t.Fatalf("singles %s, want [1]", singles)
	}
}

// aCallWaitsForABatch holds call "1" in its round trip and fails the test
// unless call "2" then queues, though slots are free, and goes out with
// "3" as one batch [2 3] while "1" is still held; then lets "1" end.
func aCallWaitsForABatch(t *testing.T, e *echo, g *Group[string, string]) {
	t.Helper()
	ctx := context.Background()
	started, release := e.hold()
	first := make(chan string, 1)
	go func() { r, _ := g.Do(ctx, "1"); first <- r }()
	<-started
	answers := make(chan string, 2)
	go func() { r, _ := g.Do(ctx, "2"); answers <- r }()
	waitQueued(t, g, 1) // not alone: three slots are free
	go func() { r, _ := g.Do(ctx, "3"); answers <- r }()
	got := []string{<-answers, <-answers} // while "1" is still held
	if !(got[0] == "re:2" && got[1] == "re:3" || got[0] == "re:3" && got[1] == "re:2") {
		t.Fatalf("answers %q, want re:2 and re:3", got)
	}
	e.mu.Lock()
	batches := fmt.Sprint(e.batches)
	e.mu.Unlock()
	if batches != "[[2 3]]" {
		t.Fatalf("batches %s, want [[2 3]]", batches)
	}
	release()
	if r := <-first; r != "re:1" {
		t.Fatalf("the held call answered %q", r)
	}
}

// TestUnloadedCallsRunAlone: with fewer than LoadedAt requests in the
// group, a call runs alone whenever a slot is free, however many round
// trips are out (LoneInFlight holds calls back only under load): a few
// callers never wait for one another.
func TestUnloadedCallsRunAlone(t *testing.T) {
	e, g := newEcho(Config[string]{MaxInFlight: 4, LoneInFlight: 1, MinBatch: 2, LoadedAt: 3})
	callsRunAloneBesideAHeldOne(t, e, g)
	if len(e.batches) != 0 || len(e.singles) != 3 {
		t.Fatalf("batches %v, singles %v; want none and three", e.batches, e.singles)
	}
}

// callsRunAloneBesideAHeldOne holds call "1" in its round trip and fails
// the test unless calls "2" and "3", one after the other, get their answers
// while it is held; then lets "1" end.
func callsRunAloneBesideAHeldOne(t *testing.T, e *echo, g *Group[string, string]) {
	t.Helper()
	ctx := context.Background()
	started, release := e.hold()
	first := make(chan string, 1)
	go func() { r, _ := g.Do(ctx, "1"); first <- r }()
	<-started
	alone := make(chan error, 1)
	go func() {
		for _, k := range []string{"2", "3"} {
			if r, err := g.Do(ctx, k); err != nil || r != "re:"+k {
				alone <- fmt.Errorf("call %s beside a held one: %q %v", k, r, err)
				return
			}
		}
		alone <- nil
	}()
	select {
	case err := <-alone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		release()
		t.Fatal("calls beside a held one, with no batches forming, waited for it")
	}
	release()
	if r := <-first; r != "re:1" {
		t.Fatalf("the held call answered %q", r)
	}
}

func TestOneKeyOncePerBatch(t *testing.T) {
	e, g := newEcho(Config[string]{MaxInFlight: 1, Key: func(s string) string { return s[:1] }})
	started, release := e.hold()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _, _ = g.Do(context.Background(), "first") }()
	<-started
	reqs := []string{"a1", "b1", "a2", "c1", "a3", "b2"}
	for i, r := range reqs {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = g.Do(context.Background(), r) }()
		waitQueued(t, g, i+1) // in this order
	}
	release()
	wg.Wait()
	if got := fmt.Sprint(e.batches); got != "[[a1 b1 c1] [a2 b2]]" || fmt.Sprint(e.singles) != "[first a3]" {
		t.Fatalf("batches %s, singles %v; want [[a1 b1 c1] [a2 b2]], [first a3]", got, e.singles)
	}
}

func TestPerRequestErrors(t *testing.T) {
	e, g := newEcho(Config[string]{MaxInFlight: 1})
	bad := errors.New("bad request")
	e.batchFn = func(_ context.Context, reqs []string, resps []string, errs []error) {
		for i, r := range reqs {
			if r == "bad" {
				errs[i] = bad
			} else {
				resps[i] = "re:" + r
			}
		}
	}
	started, release := e.hold()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _, _ = g.Do(context.Background(), "first") }()
	<-started
	var goodResp string
	var goodErr, badErr error
	wg.Add(2)
	go func() { defer wg.Done(); goodResp, goodErr = g.Do(context.Background(), "good") }()
	go func() { defer wg.Done(); _, badErr = g.Do(context.Background(), "bad") }()
	waitQueued(t, g, 2)
	release()
	wg.Wait()
	if goodResp != "re:good" || goodErr != nil || !errors.Is(badErr, bad) {
		t.Fatalf("good: %q %v; bad: %v", goodResp, goodErr, badErr)
	}
}

// TestCancelWhileQueued: a call whose context ends before its round trip
// leaves the queue and never runs.
func TestCancelWhileQueued(t *testing.T) {
	e, g := newEcho(Config[string]{MaxInFlight: 1})
	started, release := e.hold()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _, _ = g.Do(context.Background(), "first") }()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() { _, err := g.Do(ctx, "cancelled"); errc <- err }()
	waitQueued(t, g, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call returned %v", err)
	}
	if g.waiting() != 0 {
		t.Fatal("the cancelled call is still queued")
	}
	release()
	wg.Wait()
	if _, err := g.Do(context.Background(), "after"); err != nil {
		t.Fatal(err)
	}
	for _, b := range e.batches {
		t.Errorf("batch %v ran", b)
	}
	if fmt.Sprint(e.singles) != "[first after]" {
		t.Errorf("singles %v, want [first after]", e.singles)
	}
}

// TestCancelledMemberDoesNotCancelTheBatch: a member that gives up returns
// at once; the batch goes on for the others, and is cancelled only when
// every member has given up.
func TestCancelledMemberDoesNotCancelTheBatch(t *testing.T) {
	e, g := newEcho(Config[string]{MaxInFlight: 1})
	inBatch := make(chan struct{})
	proceed := make(chan struct{})
	var batchErr error
	e.batchFn = func(ctx context.Context, reqs []string, resps []string, errs []error) {
		close(inBatch)
		<-proceed
		batchErr = ctx.Err()
		for i, r := range reqs {
			resps[i] = "re:" + r
		}
	}
	started, release := e.hold()
	go func() { _, _ = g.Do(context.Background(), "first") }()
	<-started
	ctxA, cancelA := context.WithCancel(context.Background())
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	errA, respB := make(chan error), make(chan string)
	go func() { _, err := g.Do(ctxA, "a"); errA <- err }()
	waitQueued(t, g, 1)
	go func() { r, _ := g.Do(ctxB, "b"); respB <- r }()
	waitQueued(t, g, 2)
	release()
	<-inBatch
	cancelA()
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Fatalf("a member that gave up got %v", err)
	}
	close(proceed)
	if r := <-respB; r != "re:b" || batchErr != nil {
		t.Fatalf("the other member got %q; the batch's context: %v", r, batchErr)
	}

	// Both give up: the batch's context ends.
	inBatch, proceed = make(chan struct{}), make(chan struct{})
	ended := make(chan error)
	e.batchFn = func(ctx context.Context, reqs []string, resps []string, errs []error) {
		close(inBatch)
		<-ctx.Done()
		ended <- ctx.Err()
	}
	started, release = e.hold()
	go func() { _, _ = g.Do(context.Background(), "first") }()
	<-started
	ctxC, cancelC := context.WithCancel(context.Background())
	ctxD, cancelD := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { _, err := g.Do(ctxC, "c"); done <- err }()
	go func() { _, err := g.Do(ctxD, "d"); done <- err }()
	waitQueued(t, g, 2)
	release()
	<-inBatch
	cancelC()
	cancelD()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the batch's context: %v", err)
	}
	for range 2 {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("a member got %v", err)
		}
	}
}

// TestManyCallers: 64 goroutines, 500 calls each, 3 slots: every caller gets
// its own answer, and nothing is left queued or in flight.
func TestManyCallers(t *testing.T) {
	_, g := newEcho(Config[string]{MaxBatch: 16, MaxInFlight: 3})
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				req := fmt.Sprintf("%d/%d", w, i)
				if got, err := g.Do(context.Background(), req); err != nil || got != "re:"+req {
					t.Errorf("%s: %q %v", req, got, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// A batch answers its members before its goroutine passes the slot on
	// (next): the last may still be on its way out.
	g.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight != 0 || len(g.queue) != 0 {
		t.Fatalf("after every call: %d in flight, %d queued", g.inFlight, len(g.queue))
	}
	b, r := g.Stats()
	t.Logf("%d batches carried %d of 32000 calls", b, r)
}

// TestCancelledCallsNeverCrossAnswers: 64 goroutines make 300 calls each,
// a third of them on a context cancelled while the call waits or while its
// batch is out; the round trips yield, so calls queue and batches form.
// Calls and batch buffers are reused: every answer a caller gets must be
// its own request's, every failure its own context's error, and nothing is
// left queued or in flight.
func TestCancelledCallsNeverCrossAnswers(t *testing.T) {
	answer := func(req string) string { return "re:" + req }
	g := New(Config[string]{MaxBatch: 16, MaxInFlight: 2, MinBatch: 8},
		func(ctx context.Context, req string) (string, error) {
			runtime.Gosched()
			return answer(req), nil
		},
		func(ctx context.Context, reqs []string, resps []string, errs []error) {
			runtime.Gosched()
			for i, r := range reqs {
				resps[i] = answer(r)
			}
		})
	var wg sync.WaitGroup
	var answered, cancelled atomic.Int64
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				req := fmt.Sprintf("%d/%d", w, i)
				ctx, cancel := context.WithCancel(context.Background())
				if i%3 == 0 {
					go func() { runtime.Gosched(); cancel() }() // while the call waits, or is out
				}
				got, err := g.Do(ctx, req)
				cancel()
				switch {
				case err == nil && got == answer(req):
					answered.Add(1)
				case err == nil:
					t.Errorf("%s was answered %q: another call's answer", req, got)
					return
				case errors.Is(err, context.Canceled) && i%3 == 0:
					cancelled.Add(1)
				default:
					t.Errorf("%s: %v", req, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	g.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight != 0 || g.flying != 0 || len(g.queue) != 0 {
		t.Fatalf("after every call: %d trips in flight carrying %d, %d queued", g.inFlight, g.flying, len(g.queue))
	}
	b, r := g.Stats()
	t.Logf("%d answered, %d cancelled; %d batches carried %d calls", answered.Load(), cancelled.Load(), b, r)
	if b == 0 || cancelled.Load() == 0 {
		t.Fatal("no batch formed or no call was cancelled: the test exercised nothing")
	}
}

// TestAPanicFreesItsSlot: a single call that panics passes the panic to its
// caller and frees its slot for the calls after it.
func TestAPanicFreesItsSlot(t *testing.T) {
	g := New(Config[string]{MaxInFlight: 1}, func(_ context.Context, req string) (string, error) {
		if req == "panic" {
			panic("store bug")
		}
		return "re:" + req, nil
	}, func(context.Context, []string, []string, []error) { t.Error("no batch expected") })
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic did not reach the caller")
			}
		}()
		_, _ = g.Do(context.Background(), "panic")
	}()
	if got, err := g.Do(context.Background(), "after"); err != nil || got != "re:after" {
		t.Fatalf("the call after a panic: %q %v", got, err)
	}
}

// TestWaitOutlastsTheBatch: after every member of a batch gave up (each
// returned its context's error), Wait returns only when the batch's round
// trip has ended — what a store's Close waits for before it closes the
// connections the batch holds.
func TestWaitOutlastsTheBatch(t *testing.T) {
	e, g := newEcho(Config[string]{MaxInFlight: 1})
	inBatch, proceed := make(chan struct{}), make(chan struct{})
	var ended atomic.Bool
	e.batchFn = func(ctx context.Context, reqs []string, resps []string, errs []error) {
		close(inBatch)
		<-proceed // a round trip that outlasts its callers
		ended.Store(true)
	}
	started, release := e.hold()
	go func() { _, _ = g.Do(context.Background(), "first") }()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	for _, r := range []string{"a", "b"} {
		go func() { _, err := g.Do(ctx, r); done <- err }()
	}
	waitQueued(t, g, 2)
	release()
	<-inBatch
	cancel()
	for range 2 {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("a member got %v", err)
		}
	}
	waited := make(chan bool)
	go func() { g.Wait(); waited <- ended.Load() }()
	close(proceed)
	if !<-waited {
		t.Fatal("Wait returned while the batch was still running")
	}
}

// stepClock is a clock for Config.Now that moves on by step at each
// reading: with it every round trip takes step (two readings, start and
// end).
type stepClock struct {
	mu   sync.Mutex
	now  time.Time
	step time.Duration
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(c.step)
	return c.now
}

func (c *stepClock) setStep(d time.Duration) {
	c.mu.Lock()
	c.step = d
	c.mu.Unlock()
}

// roundTrips makes n calls one after the other (each alone: none is in
// flight beside it), named name0, name1, ….
func roundTrips(t *testing.T, g *Group[string, string], n int, name string) {
	t.Helper()
	for i := range n {
		if _, err := g.Do(context.Background(), fmt.Sprint(name, i)); err != nil {
			t.Fatal(err)
		}
	}
}

// fastConfig never counts as loaded by its own settings (a call runs alone
// whenever a slot is free), and holds calls back at any load while round
// trips take under a millisecond.
func fastConfig(clock *stepClock) Config[string] {
	return Config[string]{MaxInFlight: 4, LoadedAt: 1000, MinBatch: 1000,
		FastTrip: time.Millisecond, Fast: Hold{LoneInFlight: 1, LoadedAt: 1, MinBatch: 2}, Now: clock.Now}
}

// TestWhileTripsAreFastACallWaitsForABatch: with round trips under
// FastTrip, the Fast settings hold a call back beside a round trip in
// flight, though slots are free and the group is not loaded by its own
// settings; the queue goes out at Fast.MinBatch.
func TestWhileTripsAreFastACallWaitsForABatch(t *testing.T) {
	clock := &stepClock{now: time.Unix(0, 0), step: 100 * time.Microsecond}
	e, g := newEcho(fastConfig(clock))
	roundTrips(t, g, 20, "warm") // fast round trips, alone
	aCallWaitsForABatch(t, e, g)
}

// TestWhileTripsAreSlowCallsRunAlone: once round trips take longer than
// FastTrip on average (a distant server, where waiting for a round trip
// costs more than making one), the group's own settings apply again: here
// a call beside a held one runs alone at once; and when trips are fast
// again, calls are held back again.
func TestWhileTripsAreSlowCallsRunAlone(t *testing.T) {
	clock := &stepClock{now: time.Unix(0, 0), step: 5 * time.Millisecond}
	e, g := newEcho(fastConfig(clock))
	roundTrips(t, g, 20, "slow") // slow round trips, alone
	callsRunAloneBesideAHeldOne(t, e, g)
	if len(e.batches) != 0 {
		t.Fatalf("batches %v, want none", e.batches)
	}

	clock.setStep(100 * time.Microsecond)
	roundTrips(t, g, 40, "fast") // fast again
	aCallWaitsForABatch(t, e, g)
}

// TestGatherKeepsAShortQueueWhileTripsAreOut: with Hold.GatherAt, a queue
// shorter than MinBatch does not go out at the end of a round trip while
// another is in flight; it goes at the end of the last one.
func TestGatherKeepsAShortQueueWhileTripsAreOut(t *testing.T) {
	for _, gatherAt := range []int{0, 1} {
		gather := gatherAt > 0
		t.Run(fmt.Sprint("gatherAt=", gatherAt), func(t *testing.T) {
			e, g := newEcho(Config[string]{MaxInFlight: 4, LoneInFlight: 1, LoadedAt: 1, MinBatch: 3,
				FastTrip: time.Hour, Fast: Hold{LoneInFlight: 1, LoadedAt: 1, MinBatch: 3, GatherAt: gatherAt}})
			inBatch, endBatch := make(chan struct{}), make(chan struct{})
			e.batchFn = func(ctx context.Context, reqs []string, resps []string, errs []error) {
				if reqs[0] == "2" {
					close(inBatch)
					<-endBatch
				}
				for i, r := range reqs {
					resps[i] = "re:" + r
				}
			}
			ctx := context.Background()
			started, release := e.hold()
			first := make(chan string, 1)
			go func() { r, _ := g.Do(ctx, "1"); first <- r }()
			<-started
			answers := make(chan string, 4)
			for i, k := range []string{"2", "3", "4"} { // MinBatch: out at once, and held
				go func() { r, _ := g.Do(ctx, k); answers <- r }()
				if k != "4" {
					waitQueued(t, g, i+1)
				}
			}
			<-inBatch
			go func() { r, _ := g.Do(ctx, "5"); answers <- r }()
			waitQueued(t, g, 1)
			release() // "1" ends; the batch [2 3 4] is still out
			if r := <-first; r != "re:1" {
				t.Fatalf("the held call answered %q", r)
			}
			got := map[string]bool{}
			if gather {
				if n := g.waiting(); n != 1 {
					t.Fatalf("after the first trip ended, %d queued; want 1 (5 gathering)", n)
				}
			} else if r := <-answers; r != "re:5" {
				t.Fatalf("without Gather, the first answer after the first trip is %q, want re:5", r)
			} else {
				got[r] = true
			}
			close(endBatch)
			for range 4 - len(got) { // the answers still due
				got[<-answers] = true
			}
			if len(got) != 4 {
				t.Fatalf("answers %v, want re:2 … re:5", got)
			}
			e.mu.Lock()
			defer e.mu.Unlock()
			if want := "[[2 3 4]]"; fmt.Sprint(e.batches) != want || fmt.Sprint(e.singles) != "[1 5]" {
				t.Fatalf("batches %v, singles %v; want %s and [1 5]", e.batches, e.singles, want)
			}
		})
	}
}

// TestBatchedCallAllocations: once warm, a call that waits for a
// batch allocates nothing of its own in the group (its call and the
// batch's buffers are reused), and callers sharing one context cost the
// batch one watch on it, not one each: what 32 callers of one cancellable
// context allocate is the batches' own (its context and the watch, about
// seven), not a multiple of their calls — where a call, its channel and a
// watch each made over 80 a batch of 13. Counted per batch, so the bound
// holds whatever size the batches take on a machine.
func TestBatchedCallAllocations(t *testing.T) {
	if raceDetector {
		t.Skip("the race detector allocates")
	}
	res := testing.Benchmark(BenchmarkBatchedCalls)
	b, r := res.Extra["batches"], res.Extra["requests"]
	perBatch := float64(res.MemAllocs) / b
	t.Logf("%d calls, %.2f allocations a call, %.1f a batch; %v batches carried %v calls", res.N, float64(res.MemAllocs)/float64(res.N), perBatch, b, r)
	if r < float64(res.N)/2 {
		t.Fatalf("only %v of %d calls were batched: the test measures lone calls", r, res.N)
	}
	if perBatch >= 16 {
		t.Fatalf("%.1f allocations a batch of %.1f calls, want under 16", perBatch, r/b)
	}
}

// BenchmarkBatchedCalls: 32 callers of one cancellable context through a
// group of one round trip in flight, whose round trips only yield the
// processor (the callers queue meanwhile).
func BenchmarkBatchedCalls(b *testing.B) {
	b.ReportAllocs()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := New(Config[int]{MaxInFlight: 1},
		func(_ context.Context, req int) (int, error) {
			runtime.Gosched()
			return req + 1, nil
		},
		func(_ context.Context, reqs []int, resps []int, _ []error) {
			runtime.Gosched()
			for i, r := range reqs {
				resps[i] = r + 1
			}
		})
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if got, err := g.Do(ctx, i); err != nil || got != i+1 {
				b.Errorf("Do(%d) = %d, %v", i, got, err)
				return
			}
		}
	})
	g.Wait()
	batches, requests := g.Stats()
	b.ReportMetric(float64(batches), "batches")
	b.ReportMetric(float64(requests), "requests")
}
