package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/redisstore"
)

// TestBatchScripts: a coalesced batch is one run of a script over many
// keys, acquisitions and settles alike, each in its turn. Each call gets the
// answer it would get alone; an error answers its own call only, the calls
// after it still run; a batch run twice (a resend) answers the same claims,
// as a lone call does.
func TestBatchScripts(t *testing.T) {
	s := testenv.OpenRedis(t, testenv.RandomName("idemtest:")+":")
	ctx := context.Background()
	c := s.Client()
	a, b, held := s.KeyName("a"), s.KeyName("b"), s.KeyName("held")
	fp := redisstore.EncodeFingerprint("fp")
	// "held" is claimed first by a lone acquisition.
	if _, err := s.Acquire(ctx, idem.AcquireRequest{Key: "held", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	acquire := func() []any {
		v, err := c.Eval(ctx, redisstore.BatchScript, []string{a, held, b},
			"a", fp, 60000, 3600000, 0, "n-a",
			"a", fp, 60000, 3600000, 0, "n-held",
			"a", fp, 60000, 3600000, 0, "n-b").Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	first, again := acquire(), acquire()
	outcomes := []idem.Outcome{idem.Acquired, idem.InProgress, idem.Acquired}
	fences := make([]uint64, 3)
	for i, want := range outcomes {
		got := first[i].([]any)
		if got[0] != int64(want) {
			t.Fatalf("call %d: outcome %v, want %v", i, got[0], want)
		}
		if re := again[i].([]any); re[0] != got[0] || re[1] != got[1] {
			t.Fatalf("call %d run twice: %q then %q, want the same answer", i, got, re)
		}
		rec, ok := redisstore.DecodeRecord(got[1].(string))
		if !ok {
			t.Fatalf("call %d answered %q", i, got[1])
		}
		fences[i] = rec.Fence
	}
	// Complete a, an unknown op on held (an error), complete b with a stale
	// fence, complete b, acquire b (a replay now) and a new key c, then
	// complete c with the fence its acquisition in this run took (the
	// server's time in µs, at least the fences before): one error, the
	// rest answered in order, each seeing the calls before it.
	c1, c2 := s.KeyName("c1"), s.KeyName("c2")
	v, err := c.Eval(ctx, redisstore.BatchScript, []string{a, held, b, b, b, c1, c2},
		"o", "c", fences[0], 3600000, "done-a", "s-a",
		"o", "?", fences[1], 3600000, "", "s-held",
		"o", "c", fences[2]-1, 3600000, "stale", "s-b1",
		"o", "c", fences[2], 3600000, "done-b", "s-b2",
		"a", fp, 60000, 3600000, 0, "n-b2",
		"a", fp, 60000, 3600000, 0, "n-c1",
		"o", "c", fences[2], 3600000, "never", "s-c2").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if v[0] != int64(1) || v[2] != int64(0) || v[3] != int64(1) {
		t.Fatalf("settles answered %v, want 1, an error, 0, 1", v[:4])
	}
	if got := v[4].([]any); got[0] != int64(idem.Replayed) {
		t.Fatalf("acquire of b after its completion in the same run: %v, want Replayed", got)
	}
	if got := v[5].([]any); got[0] != int64(idem.Acquired) {
		t.Fatalf("acquire of c1: %v, want Acquired", got)
	}
	if v[6] != int64(0) {
		t.Fatalf("complete of c2, which nobody acquired: %v, want 0 (stale)", v[6])
	}
	if e, ok := v[1].(error); !ok || !strings.Contains(e.Error(), "unknown op") {
		t.Fatalf("the unknown op answered %#v, want its own error", v[1])
	}
	for key, want := range map[string]string{"a": "done-a", "b": "done-b"} {
		if rec, err := s.Get(ctx, key); err != nil || rec.State != idem.StateCompleted || string(rec.Result) != want {
			t.Fatalf("%s: %+v %v", key, rec, err)
		}
	}
	if rec, err := s.Get(ctx, "held"); err != nil || rec.State != idem.StateInFlight {
		t.Fatalf("held after an erring settle: %+v %v, want still in flight", rec, err)
	}
}
