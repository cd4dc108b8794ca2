package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	peer "github.com/faustbrian/go-idempotency"
	"github.com/faustbrian/go-idempotency/idempotencycommand"
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

// The work both libraries guard: it returns one small JSON document.
var result = []byte(`{"id":"PAY-1","amount":100,"status":"captured"}`)

type payment struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	Status string `json:"status"`
}

// runner is one library's run wrapper over one store: it runs the work for
// id unless a run of id completed, and says which happened.
type runner struct {
	run   func(ctx context.Context, id string) (value []byte, replayed bool, err error)
	do    func(ctx context.Context, id string) (payment, error) // a typed replay or run
	close func()
}

// idemRunner wraps a Guard over s: Guard.Run and idem.Do.
func idemRunner(s store.Store, closeStore func()) (runner, error) {
	g, err := idem.NewGuard(idem.Config{Store: s})
	if err != nil {
		return runner{}, err
	}
	opts := &idem.RunOptions{Fingerprint: idem.Fingerprint([]byte("benchmark request"))}
	work := func(context.Context, uint64) ([]byte, error) { return result, nil }
	fn := func(context.Context) (payment, error) {
		return payment{ID: "PAY-1", Amount: 100, Status: "captured"}, nil
	}
	return runner{
		run: func(ctx context.Context, id string) ([]byte, bool, error) {
			res, err := g.Run(ctx, idem.Key{Scope: "payments", ID: id}, opts, work)
			return res.Value, res.Outcome == store.Replayed, err
		},
		do: func(ctx context.Context, id string) (payment, error) {
			return idem.DoWith(ctx, g, idem.Key{Scope: "payments", ID: id}, opts, fn)
		},
		close: closeStore,
	}, nil
}

// peerRunner wraps the peer's idempotencycommand.Runner over store; its
// typed replay is the Runner's followed by json.Unmarshal, what a caller of
// the peer writes to get the same value idem.Do returns.
func peerRunner(store peer.Store, closeStore func()) (runner, error) {
	svc, err := peer.NewService(store)
	if err != nil {
		return runner{}, err
	}
	r, err := idempotencycommand.New(idempotencycommand.Options{Service: svc, Lease: time.Minute})
	if err != nil {
		return runner{}, err
	}
	fp, err := peer.NewFingerprint("v1", []byte("benchmark request"))
	if err != nil {
		return runner{}, err
	}
	handler := func(context.Context) ([]byte, map[string]string, error) { return result, nil, nil }
	request := func(id string) idempotencycommand.Request {
		return idempotencycommand.Request{Namespace: "bench", Tenant: "tenant", Name: "payments", Caller: "caller", SourceID: id, Fingerprint: fp}
	}
	run := func(ctx context.Context, id string) ([]byte, bool, error) {
		res, err := r.Run(ctx, request(id), handler)
		return res.Result, res.Replayed, err
	}
	return runner{
		run: run,
		do: func(ctx context.Context, id string) (payment, error) {
			var p payment
			v, _, err := run(ctx, id)
			if err != nil {
				return p, err
			}
			err = json.Unmarshal(v, &p)
			return p, err
		},
		close: closeStore,
	}, nil
}

// wallClock is the peer's memory store's clock: the real one.
type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// ownerTokens numbers the peer's owners, as cheap a token as it allows.
func ownerTokens() func() (string, error) {
	var n atomic.Uint64
	return func() (string, error) { return "owner-" + strconv.FormatUint(n.Add(1), 10), nil }
}

// firstRuns is a side whose every round runs the work for n fresh keys on a
// runner made for the round.
func firstRuns(name string, workers, n int, newRunner func() (runner, error)) side {
	var round atomic.Int64
	return side{name: name, round: func() (measured, error) {
		r, err := newRunner()
		if err != nil {
			return measured{}, err
		}
		defer r.close()
		prefix := "r" + strconv.FormatInt(round.Add(1), 10) + "-"
		ctx := context.Background()
		return drive(workers, n, func(i int) error {
			_, replayed, err := r.run(ctx, prefix+strconv.Itoa(i))
			if err == nil && replayed {
				err = fmt.Errorf("a fresh key replayed")
			}
			return err
		})
	}}
}

// replays is a side whose rounds replay n times one key, run once first.
func replays(name string, workers, n int, r runner) (side, error) {
	ctx := context.Background()
	if _, _, err := r.run(ctx, "hot"); err != nil {
		return side{}, err
	}
	return side{name: name, round: func() (measured, error) {
		return drive(workers, n, func(int) error {
			v, replayed, err := r.run(ctx, "hot")
			if err == nil && (!replayed || len(v) == 0) {
				err = fmt.Errorf("the hot key did not replay")
			}
			return err
		})
	}}, nil
}

// pair makes one runner of each library.
func pair(newIdem, newPeer func() (runner, error)) (ir, pr runner, err error) {
	if ir, err = newIdem(); err != nil {
		return runner{}, runner{}, err
	}
	if pr, err = newPeer(); err != nil {
		ir.close()
		return runner{}, runner{}, err
	}
	return ir, pr, nil
}

// runComparisons compares first runs on fresh keys (a runner per round) and
// replays of one key on one store kind; done runs after the last.
func runComparisons(store string, workers, fresh, hot int, newIdem, newPeer func() (runner, error), done func()) ([]comparison, error) {
	ir, pr, err := pair(newIdem, newPeer)
	if err != nil {
		return nil, err
	}
	closeAll := func() { ir.close(); pr.close(); done() }
	ireplay, err := replays("idem Guard.Run", workers, hot, ir)
	if err == nil {
		var preplay side
		if preplay, err = replays("peer Runner.Run", workers, hot, pr); err == nil {
			return []comparison{
				{name: fmt.Sprintf("%s, first run on a fresh key, %d goroutines", store, workers), sides: []side{
					firstRuns("idem Guard.Run", workers, fresh, newIdem),
					firstRuns("peer Runner.Run", workers, fresh, newPeer),
				}},
				{name: fmt.Sprintf("%s, replay of one key, %d goroutines", store, workers), sides: []side{ireplay, preplay}, close: closeAll},
			}, nil
		}
	}
	closeAll()
	return nil, err
}
