package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/sqlitestore"
)

func newDemoCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "demo",
		Short: "Run the failure sequences idem exists for, on a temporary SQLite store, and check every invariant",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := os.MkdirTemp("", "idem-demo-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			ok, err := runDemo(cmd.Context(), cmd.OutOrStdout(), filepath.Join(dir, "demo.db"))
			if err != nil {
				return err
			}
			if !ok {
				return exitCode(1)
			}
			return nil
		},
	}
}

// demo prints a timeline and keeps the tally of deliveries and executions.
type demo struct {
	w       io.Writer
	start   time.Time
	path    string
	store   *sqlitestore.Store
	tallies []tally
}

type tally struct {
	name                  string
	deliveries, execution int
	want                  int
	extra                 bool // a further invariant of the scenario held
	extraWhat             string
}

func (d *demo) say(who, format string, args ...any) {
	el := time.Since(d.start)
	fmt.Fprintf(d.w, "  %6.3fs  %-9s %s\n", el.Seconds(), who, fmt.Sprintf(format, args...))
}

func (d *demo) open(ctx context.Context) error {
	s, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: d.path})
	if err != nil {
		return err
	}
	d.store = s
	return nil
}

func (d *demo) guard(lease time.Duration) (*idem.Guard, error) {
	return idem.NewGuard(idem.Config{Store: d.store, Lease: lease, Retention: time.Hour})
}

// runDemo runs the four sequences against a SQLite file at path. It returns
// false if an invariant did not hold.
func runDemo(ctx context.Context, w io.Writer, path string) (bool, error) {
	d := &demo{w: w, start: time.Now(), path: path}
	if err := d.open(ctx); err != nil {
		return false, err
	}
	defer func() { d.store.Close() }()
	fmt.Fprintf(w, "idem demo — every sequence runs on the SQLite store %s\n", path)
	for _, step := range []func(context.Context) error{d.lostAnswer, d.crashBeforeAck, d.concurrentDuplicates, d.zombieLease} {
		fmt.Fprintln(w)
		if err := step(ctx); err != nil {
			return false, err
		}
	}
	return d.summary(), nil
}

type booking struct {
	ID   string `json:"id"`
	Seat string `json:"seat"`
}

// 1. The answer to a booking request is lost; the client retries with the
// same key and gets the first booking back.
func (d *demo) lostAnswer(ctx context.Context) error {
	fmt.Fprintln(d.w, "1. A sender retries after a lost answer")
	g, err := d.guard(30 * time.Second)
	if err != nil {
		return err
	}
	key := idem.Key{Scope: "POST /bookings", ID: "booking-7f3a9c"}
	t := tally{name: "sender retry after a lost answer", want: 1}
	var bookings int
	book := func(ctx context.Context, fence uint64) ([]byte, error) {
		bookings++
		d.say("server", "books seat 12A → booking B-%04d (fence %d)", bookings, fence)
		return json.Marshal(booking{ID: fmt.Sprintf("B-%04d", bookings), Seat: "12A"})
	}
	var first booking
	for attempt := 1; attempt <= 2; attempt++ {
		t.deliveries++
		if attempt == 1 {
			d.say("client", "POST /bookings  Idempotency-Key: %s", key.ID)
		} else {
			d.say("client", "retries: same request, same Idempotency-Key: %s", key.ID)
		}
		res, err := g.Run(ctx, key, &idem.RunOptions{Fingerprint: idem.Fingerprint([]byte("seat=12A"))}, book)
		if err != nil {
			return err
		}
		var b booking
		if err := json.Unmarshal(res.Value, &b); err != nil {
			return err
		}
		if attempt == 1 {
			d.say("server", "%s: answers 201 with booking %s", res.Outcome, b.ID)
			d.say("network", "✗ the connection drops: the client never sees the answer")
			first = b
		} else {
			d.say("server", "%s: answers 201 with the stored booking %s — no second booking", res.Outcome, b.ID)
			t.extra = res.Outcome == store.Replayed && b == first
			t.extraWhat = "the retry got the first booking back"
		}
	}
	t.execution = bookings
	d.tallies = append(d.tallies, t)
	return nil
}

// 2. A consumer credits an account, then dies before acknowledging; the
// broker redelivers to the restarted consumer.
func (d *demo) crashBeforeAck(ctx context.Context) error {
	fmt.Fprintln(d.w, "2. A broker redelivers after a crash between the work and the ack")
	key := idem.Key{Scope: "credit-transfers", ID: "PAY-2026-000042"}
	t := tally{name: "redelivery after a crash before the ack", want: 1}
	var credits int
	balance := 0
	credit := func(ctx context.Context, fence uint64) ([]byte, error) {
		credits++
		balance += 2500
		d.say("consumer", "credits account NL91 with 25.00 → balance %d.%02d (fence %d)", balance/100, balance%100, fence)
		return []byte(`"credited"`), nil
	}
	for delivery, msgID := range []string{"broker-msg-1001", "broker-msg-2417"} {
		t.deliveries++
		g, err := d.guard(30 * time.Second)
		if err != nil {
			return err
		}
		d.say("broker", "delivers %s (broker id %s, correlation id %s)", "payment instruction", msgID, key.ID)
		res, err := g.Run(ctx, key, nil, credit)
		if err != nil {
			return err
		}
		if delivery == 0 {
			d.say("consumer", "%s: work done, record completed in the store", res.Outcome)
			d.say("consumer", "✗ killed before it could ack; the broker will redeliver")
			if err := d.store.Close(); err != nil {
				return err
			}
			if err := d.open(ctx); err != nil {
				return err
			}
			d.say("consumer", "restarts and reopens the store file")
		} else {
			d.say("consumer", "%s: already credited; acks without crediting again", res.Outcome)
			t.extra = res.Outcome == store.Replayed && balance == 2500
			t.extraWhat = "balance is 25.00, credited once"
		}
	}
	t.execution = credits
	d.tallies = append(d.tallies, t)
	return nil
}

// 3. Twenty copies of one message arrive at once.
func (d *demo) concurrentDuplicates(ctx context.Context) error {
	const n = 20
	fmt.Fprintf(d.w, "3. %d duplicates arrive at the same moment\n", n)
	g, err := d.guard(30 * time.Second)
	if err != nil {
		return err
	}
	key := idem.Key{Scope: "orders", ID: "ORD-20261129-0001"}
	var executions atomic.Int32
	var outcomes [7]atomic.Int32
	var wg sync.WaitGroup
	var firstErr error
	var mu sync.Mutex
	start := make(chan struct{})
	d.say("broker", "delivers %d copies of %s to %d workers", n, key.ID, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := g.Run(ctx, key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
				executions.Add(1)
				time.Sleep(50 * time.Millisecond) // the work takes a while
				return []byte(`"shipped"`), nil
			})
			if err != nil {
				mu.Lock()
				firstErr = errors.Join(firstErr, err)
				mu.Unlock()
				return
			}
			outcomes[res.Outcome].Add(1)
		}()
	}
	close(start)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	d.say("workers", "acquired %d, in progress %d (nack, retry later), replayed %d",
		outcomes[store.Acquired].Load(), outcomes[store.InProgress].Load(), outcomes[store.Replayed].Load())
	res, err := g.Run(ctx, key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
		executions.Add(1)
		return nil, nil
	})
	if err != nil {
		return err
	}
	d.say("broker", "redelivers one of the nacked copies: %s %s", res.Outcome, res.Value)
	d.tallies = append(d.tallies, tally{name: "20 concurrent duplicates", deliveries: n + 1, execution: int(executions.Load()), want: 1,
		extra: outcomes[store.Acquired].Load() == 1 && res.Outcome == store.Replayed, extraWhat: "exactly one worker acquired"})
	return nil
}

// 4. An owner stalls past its lease; another takes over; the stalled owner's
// late completion is refused by its stale fence.
func (d *demo) zombieLease(ctx context.Context) error {
	fmt.Fprintln(d.w, "4. A zombie lease is taken over")
	const lease = 300 * time.Millisecond
	key := idem.Key{Scope: "invoices", ID: "INV-88"}.Storage(false)
	req := store.AcquireRequest{Key: key, Lease: lease, Retention: time.Hour}
	t := tally{name: "zombie lease taken over", want: 2, deliveries: 2}
	a, err := d.store.Acquire(ctx, req)
	if err != nil {
		return err
	}
	t.execution++
	d.say("worker A", "%s invoices/INV-88 with fence %d, lease %v; starts sending the invoice", a.Outcome, a.Fence, lease)
	d.say("worker A", "✗ stalls (a long GC pause, a frozen VM) and stops heartbeating")
	time.Sleep(lease + 100*time.Millisecond)
	b, err := d.store.Acquire(ctx, req)
	if err != nil {
		return err
	}
	t.execution++
	d.say("worker B", "%s: A's lease expired; runs the work with fence %d", b.Outcome, b.Fence)
	if err := d.store.Complete(ctx, key, b.Fence, []byte("sent by B"), time.Hour); err != nil {
		return err
	}
	d.say("worker B", "completes the record with fence %d", b.Fence)
	errA := d.store.Complete(ctx, key, a.Fence, []byte("sent by A"), time.Hour)
	if errors.Is(errA, store.ErrStaleFence) {
		d.say("worker A", "wakes up and tries to complete with fence %d → refused: %v", a.Fence, errA)
	} else {
		d.say("worker A", "wakes up and completes with fence %d → %v (NOT refused!)", a.Fence, errA)
	}
	rec, err := d.store.Get(ctx, key)
	if err != nil {
		return err
	}
	d.say("store", "holds %q with fence %d; a business write conditioned on the fence rejects A too", rec.Result, rec.Fence)
	t.extra = b.Outcome == store.TakenOver && b.Fence > a.Fence && errors.Is(errA, store.ErrStaleFence) && string(rec.Result) == "sent by B"
	t.extraWhat = "the stale fence was refused, B's result kept"
	d.tallies = append(d.tallies, t)
	return nil
}

func (d *demo) summary() bool {
	fmt.Fprintln(d.w)
	fmt.Fprintln(d.w, "Summary")
	allOK := true
	deliveries, executions := 0, 0
	for _, t := range d.tallies {
		ok := t.execution == t.want && t.extra
		allOK = allOK && ok
		mark := "✓"
		if !ok {
			mark = "✗"
		}
		deliveries += t.deliveries
		executions += t.execution
		fmt.Fprintf(d.w, "  %s %-42s %2d deliveries → %d executions (want %d); %s\n", mark, t.name, t.deliveries, t.execution, t.want, t.extraWhat)
	}
	fmt.Fprintf(d.w, "  %d deliveries, %d executions", deliveries, executions)
	if allOK {
		fmt.Fprintln(d.w, " — every invariant held.")
	} else {
		fmt.Fprintln(d.w, " — AN INVARIANT FAILED.")
	}
	return allOK
}
