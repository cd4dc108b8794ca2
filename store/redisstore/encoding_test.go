package redisstore_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
)

// TestRecordsOfTheFirstEncoding: records written by the first release's
// scripts (a hash per record, testdata/first-encoding) are read and decided
// on as before by this release — Get, Scan, List, a replay, a mismatch, an
// owner settling a claim it took before the upgrade, a takeover, a released
// key run again — and each is rewritten in the packed encoding by its next
// transition.
func TestRecordsOfTheFirstEncoding(t *testing.T) {
	s := testenv.OpenRedis(t, testenv.RandomName("idemtest:")+":")
	ctx := context.Background()
	c := s.Client()
	script := func(name string) string {
		b, err := os.ReadFile("testdata/first-encoding/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	oldAcquire, oldOwned := script("acquire.lua"), script("owned.lua")
	fp := idem.Fingerprint([]byte("body"))
	// claim takes key with the first release's acquire script and returns
	// its fence.
	claim := func(key string, leaseMS int64) uint64 {
		v, err := c.Eval(ctx, oldAcquire, []string{s.KeyName(key)}, fp, leaseMS, 3600000, 0, "old-nonce-"+key).Slice()
		if err != nil || v[0] != int64(idem.Acquired) {
			t.Fatalf("old acquire of %s: %v %v", key, v, err)
		}
		return uint64(v[2].(int64))
	}
	settle := func(key, op string, fence uint64, result string) {
		n, err := c.Eval(ctx, oldOwned, []string{s.KeyName(key)}, op, fence, 3600000, result, "old-settle-"+key).Int()
		if err != nil || n != 1 {
			t.Fatalf("old %s of %s: %d %v", op, key, n, err)
		}
	}
	fences := map[string]uint64{}
	for _, k := range []string{"completed", "failed", "released", "in-flight", "lease-over", "mismatch"} {
		lease := int64(60000)
		if k == "lease-over" {
			lease = 1
		}
		fences[k] = claim(k, lease)
	}
	settle("completed", "c", fences["completed"], `{"id":1}`)
	settle("mismatch", "c", fences["mismatch"], "x")
	settle("failed", "f", fences["failed"], "declined")
	settle("released", "x", fences["released"], "")
	time.Sleep(5 * time.Millisecond) // the 1 ms lease of "lease-over" runs out (Redis's own clock)

	typeOf := func(key string) string {
		tp, err := c.Type(ctx, s.KeyName(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tp
	}
	for k := range fences {
		if typeOf(k) != "hash" {
			t.Fatalf("%s was not written in the first encoding", k)
		}
	}

	// Reads.
	want := map[string]idem.State{"completed": idem.StateCompleted, "failed": idem.StateFailed, "released": idem.StateReleased,
		"in-flight": idem.StateInFlight, "lease-over": idem.StateInFlight, "mismatch": idem.StateCompleted}
	for k, st := range want {
		rec, err := s.Get(ctx, k)
		if err != nil || rec.State != st || rec.Fence != fences[k] || rec.Fingerprint != fp || rec.Attempts != 1 {
			t.Fatalf("Get(%s) = %+v, %v; want state %v fence %d", k, rec, err, st, fences[k])
		}
	}
	if rec, _ := s.Get(ctx, "completed"); string(rec.Result) != `{"id":1}` {
		t.Fatalf("completed result %q", rec.Result)
	}
	recs, _, err := s.Scan(ctx, "", 100)
	if err != nil || len(recs) != len(want) {
		t.Fatalf("Scan: %d records, %v; want %d", len(recs), err, len(want))
	}
	listed, err := s.List(ctx, "", 0)
	if err != nil || len(listed) != len(want) || !slices.IsSortedFunc(listed, func(a, b idem.Record) int {
		if a.Key < b.Key {
			return -1
		}
		return 1
	}) {
		t.Fatalf("List: %d records, %v", len(listed), err)
	}

	// Decisions.
	acquire := func(key, fingerprint string) idem.Acquisition {
		a, err := s.Acquire(ctx, idem.AcquireRequest{Key: key, Fingerprint: fingerprint, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if a := acquire("completed", fp); a.Outcome != idem.Replayed || string(a.Record.Result) != `{"id":1}` {
		t.Fatalf("a duplicate of an old completed record: %v %q", a.Outcome, a.Record.Result)
	}
	if a := acquire("mismatch", idem.Fingerprint([]byte("other body"))); a.Outcome != idem.Mismatch {
		t.Fatalf("another payload under an old key: %v", a.Outcome)
	}
	if a := acquire("in-flight", fp); a.Outcome != idem.InProgress {
		t.Fatalf("an old live claim: %v", a.Outcome)
	}
	if err := s.Heartbeat(ctx, "in-flight", fences["in-flight"], time.Minute); err != nil {
		t.Fatalf("the owner of an old claim heartbeats: %v", err)
	}
	if err := s.Complete(ctx, "in-flight", fences["in-flight"], []byte("done"), time.Hour); err != nil {
		t.Fatalf("the owner of an old claim completes: %v", err)
	}
	if a := acquire("in-flight", fp); a.Outcome != idem.Replayed || string(a.Record.Result) != "done" {
		t.Fatalf("after the old claim completed: %v %q", a.Outcome, a.Record.Result)
	}
	if a := acquire("lease-over", fp); a.Outcome != idem.TakenOver || a.Fence <= fences["lease-over"] || a.Record.Attempts != 2 {
		t.Fatalf("an old claim whose lease ran out: %v fence %d (old %d)", a.Outcome, a.Fence, fences["lease-over"])
	}
	if err := s.Complete(ctx, "lease-over", fences["lease-over"], []byte("zombie"), time.Hour); err != idem.ErrStaleFence {
		t.Fatalf("the old owner after the takeover: %v", err)
	}
	if a := acquire("released", fp); a.Outcome != idem.Acquired || a.Fence <= fences["released"] {
		t.Fatalf("an old released record: %v fence %d", a.Outcome, a.Fence)
	}
	for _, k := range []string{"in-flight", "lease-over", "released"} {
		if typeOf(k) != "string" {
			t.Fatalf("%s was not rewritten in the packed encoding by its transition", k)
		}
		ttl, err := c.PTTL(ctx, s.KeyName(k)).Result()
		if err != nil || ttl <= 0 {
			t.Fatalf("%s has no TTL after its rewrite: %v %v", k, ttl, err)
		}
	}
	if typeOf("completed") != "hash" {
		t.Fatal("a replay rewrote the record: reads should not write")
	}
}
