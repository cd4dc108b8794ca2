package broker

import (
	"errors"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/store"
)

type msg struct {
	h    map[string]string
	body string
}

func (m msg) Header(n string) string { return m.h[n] }
func (m msg) Body() []byte           { return []byte(m.body) }

func TestKeys(t *testing.T) {
	m := msg{h: map[string]string{"Correlation-Id": "PAY-1"}, body: `{"correlation_id":"PAY-2","n":42}`}
	for _, tt := range []struct {
		f       KeyFunc
		want    string
		wantErr bool
	}{
		{HeaderKey("Correlation-Id"), "PAY-1", false},
		{HeaderKey("X-Missing"), "", true},
		{JSONKey("correlation_id"), "PAY-2", false},
		{JSONKey("n"), "42", false},
		{JSONKey("absent"), "", true},
	} {
		got, err := tt.f(m)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("got %q, %v; want %q", got, err, tt.want)
		}
	}
	if _, err := JSONKey("id")(msg{body: "not json"}); err == nil {
		t.Error("a non-JSON body gave a key")
	}
}

func TestDecisions(t *testing.T) {
	p := Policy{InProgressDelay: 2 * time.Second}
	tests := []struct {
		name string
		res  idem.Result
		err  error
		want Verdict
	}{
		{"done", idem.Result{Outcome: store.Acquired, Disposition: idem.Complete}, nil, Ack},
		{"definite failure", idem.Result{Outcome: store.Acquired, Disposition: idem.Fail}, errors.New("declined"), Ack},
		{"transient", idem.Result{Outcome: store.Acquired, Disposition: idem.Release}, errors.New("timeout"), Retry},
		{"held", idem.Result{Outcome: store.TakenOver, Disposition: idem.Hold}, errors.New("?"), Retry},
		{"replayed", idem.Result{Outcome: store.Replayed}, nil, Ack},
		{"in progress", idem.Result{Outcome: store.InProgress}, nil, Retry},
		{"mismatch", idem.Result{Outcome: store.Mismatch}, nil, DeadLetter},
		{"poisoned", idem.Result{Outcome: store.Poisoned}, nil, DeadLetter},
		{"store down", idem.Result{}, idem.ErrStoreUnavailable, Retry},
		{"bad key", idem.Result{}, idem.ErrInvalidKey, DeadLetter},
	}
	for _, tt := range tests {
		if d := p.FromGuard(tt.res, tt.err, 1); d.Verdict != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, d.Verdict, tt.want)
		}
	}
	if d := p.FromGuard(idem.Result{Outcome: store.InProgress}, nil, 1); d.Delay != 2*time.Second {
		t.Errorf("in-progress delay %v", d.Delay)
	}
	if d := p.FromInbox(inbox.Duplicate, nil, 1); d.Verdict != Ack {
		t.Error("inbox duplicate not acked")
	}
	if d := p.FromInbox(inbox.Outcome(0), errors.New("db down"), 1); d.Verdict != Retry {
		t.Error("inbox failure not retried")
	}
}

func TestBackoff(t *testing.T) {
	p := Policy{BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second}
	for attempt := 1; attempt <= 10; attempt++ {
		for range 50 {
			d := p.Backoff(attempt)
			ceil := min(100*time.Millisecond<<(attempt-1), time.Second)
			if d < 10*time.Millisecond || d > ceil {
				t.Fatalf("attempt %d: %v outside [10ms, %v]", attempt, d, ceil)
			}
		}
	}
}
