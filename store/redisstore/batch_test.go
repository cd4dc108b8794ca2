package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
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
	if _, err := s.Acquire(ctx, store.AcquireRequest{Key: "held", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	acquire := func() []any {
		var calls []byte
		for _, nonce := range []string{"n-a", "n-held", "n-b"} {
			calls = redisstore.PackAcquire(calls, fp, 60000, 3600000, 0, nonce)
		}
		v, err := c.Eval(ctx, redisstore.BatchScript, []string{a, held, b}, calls).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	first, again := acquire(), acquire()
	outcomes := []store.Outcome{store.Acquired, store.InProgress, store.Acquired}
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
	calls := redisstore.PackOwned(nil, "c", fences[0], 3600000, []byte("done-a"), "s-a")
	calls = redisstore.PackOwned(calls, "?", fences[1], 3600000, []byte(""), "s-held")
	calls = redisstore.PackOwned(calls, "c", fences[2]-1, 3600000, []byte("stale"), "s-b1")
	calls = redisstore.PackOwned(calls, "c", fences[2], 3600000, []byte("done-b"), "s-b2")
	calls = redisstore.PackAcquire(calls, fp, 60000, 3600000, 0, "n-b2")
	calls = redisstore.PackAcquire(calls, fp, 60000, 3600000, 0, "n-c1")
	calls = redisstore.PackOwned(calls, "c", fences[2], 3600000, []byte("never"), "s-c2")
	v, err := c.Eval(ctx, redisstore.BatchScript, []string{a, held, b, b, b, c1, c2}, calls).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if v[0] != int64(1) || v[2] != int64(0) || v[3] != int64(1) {
		t.Fatalf("settles answered %v, want 1, an error, 0, 1", v[:4])
	}
	if got := v[4].([]any); got[0] != int64(store.Replayed) {
		t.Fatalf("acquire of b after its completion in the same run: %v, want Replayed", got)
	}
	if got := v[5].([]any); got[0] != int64(store.Acquired) {
		t.Fatalf("acquire of c1: %v, want Acquired", got)
	}
	if v[6] != int64(0) {
		t.Fatalf("complete of c2, which nobody acquired: %v, want 0 (stale)", v[6])
	}
	if e, ok := v[1].(string); !ok || !strings.Contains(e, "unknown op") {
		t.Fatalf("the unknown op answered %#v, want its own error", v[1])
	}
	for key, want := range map[string]string{"a": "done-a", "b": "done-b"} {
		if rec, err := s.Get(ctx, key); err != nil || rec.State != store.StateCompleted || string(rec.Result) != want {
			t.Fatalf("%s: %+v %v", key, rec, err)
		}
	}
	if rec, err := s.Get(ctx, "held"); err != nil || rec.State != store.StateInFlight {
		t.Fatalf("held after an erring settle: %+v %v, want still in flight", rec, err)
	}
}

// TestConcurrentLifecyclesShareRoundTrips: 32 workers run lifecycles on one
// store, a key per record and in buckets; their calls travel in batches
// (acquisitions and settles packed in one argument, fields included), and
// every record ends completed with its own result.
func TestConcurrentLifecyclesShareRoundTrips(t *testing.T) {
	for _, buckets := range []int{0, 64} {
		t.Run(fmt.Sprintf("buckets=%d", buckets), func(t *testing.T) {
			s := testenv.OpenRedisConfig(t, "", redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":", Buckets: buckets})
			ctx := context.Background()
			const workers, each = 32, 40
			errs := make(chan error, workers)
			for w := range workers {
				go func() {
					for i := range each {
						key := fmt.Sprintf("w%d-%d", w, i)
						a, err := s.Acquire(ctx, store.AcquireRequest{Key: key, Fingerprint: "fp-" + key, Lease: time.Minute, Retention: time.Hour})
						if err == nil && a.Outcome != store.Acquired {
							err = fmt.Errorf("%s: %v", key, a.Outcome)
						}
						if err == nil {
							err = s.Complete(ctx, key, a.Fence, []byte("result of "+key), time.Hour)
						}
						if err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
			for range workers {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			for w := range workers {
				for i := range each {
					key := fmt.Sprintf("w%d-%d", w, i)
					rec, err := s.Get(ctx, key)
					if err != nil || rec.State != store.StateCompleted || string(rec.Result) != "result of "+key {
						t.Fatalf("%s: %+v %v", key, rec, err)
					}
				}
			}
			if trips, calls := s.CoalesceStats(); trips == 0 || calls < 2*trips {
				t.Fatalf("%d shared round trips carrying %d calls: no batches formed", trips, calls)
			}
		})
	}
}

// TestPackAllocations: packing a call into a batch's argument allocates
// nothing once the buffer has room (the batch allocates it once).
func TestPackAllocations(t *testing.T) {
	if raceDetector {
		t.Skip("the race detector allocates")
	}
	buf := make([]byte, 0, 512)
	fp, result := redisstore.EncodeFingerprint("0123456789abcdef0123456789abcdef"), []byte(`{"status":"ok"}`)
	if n := testing.AllocsPerRun(100, func() {
		buf = redisstore.PackAcquire(buf[:0], fp, 60000, 3600000, 3, "0123456789")
		buf = redisstore.PackOwned(buf, "c", 1764557123456789, 3600000, result, "0123456789")
	}); n != 0 {
		t.Fatalf("%v allocations to pack two calls, want 0", n)
	}
}

// TestBatchCallsKeepTheirOwnBucketTTL: the calls of a batch run one after
// another in one script, and what a call learns of its bucket must not
// carry over to the next. Each completion or acquisition below keeps its
// record an hour, in a bucket whose TTL is only minutes long, right after
// a call that learnt of another bucket: a new key's acquisition in a
// bucket with hours left (its TTL), a completion of an hour's claim (its
// value's flag: the bucket lasts past twice its retention). Had a call
// taken that for its own bucket's, it would not extend the TTL, and the
// bucket, its record with it, would go within minutes — a duplicate would
// then run the work again.
func TestBatchCallsKeepTheirOwnBucketTTL(t *testing.T) {
	s := testenv.OpenRedisConfig(t, "", redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":", Buckets: 1})
	callsKeepTheirOwnBucketTTL(t, s, s.Batch)
}

// TestLoneCallsKeepTheirOwnBucketTTL is TestBatchCallsKeepTheirOwnBucketTTL
// with each call alone, one after another: as functions, a bucket's lone
// calls share one location table too (functions.go).
func TestLoneCallsKeepTheirOwnBucketTTL(t *testing.T) {
	s := testenv.OpenRedisConfig(t, "", redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":", Buckets: 1, NoCoalesce: true})
	callsKeepTheirOwnBucketTTL(t, s, func(ctx context.Context, keys []string, fences []uint64, result []byte) ([]store.Outcome, []error) {
		outcomes, errs := make([]store.Outcome, len(keys)), make([]error, len(keys))
		for i, k := range keys {
			if fences[i] == 0 {
				var a store.Acquisition
				a, errs[i] = s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Hour})
				outcomes[i] = a.Outcome
			} else {
				errs[i] = s.Complete(ctx, k, fences[i], result, time.Hour)
			}
		}
		return outcomes, errs
	})
}

// callsKeepTheirOwnBucketTTL runs the calls of TestBatchCallsKeepTheirOwnBucketTTL
// through run: an acquisition (for an hour) where the fence is 0, else a
// completion for an hour.
func callsKeepTheirOwnBucketTTL(t *testing.T, s *redisstore.Store, run func(ctx context.Context, keys []string, fences []uint64, result []byte) ([]store.Outcome, []error)) {
	ctx := context.Background()
	bucketOf := func(key string) string { keys, _ := s.Locate(key); return keys[1] }
	claim := func(key string, retention time.Duration) uint64 {
		t.Helper()
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: key, Lease: time.Minute, Retention: retention})
		if err != nil || a.Outcome != store.Acquired {
			t.Fatalf("claim %s: %v, %v", key, a.Outcome, err)
		}
		return a.Fence
	}
	// bucketWith makes key's bucket hold another key's claim for retention
	// (one bucket a cluster slot: a key found by trying).
	bucketWith := func(key string, retention time.Duration) {
		t.Helper()
		for i := 0; ; i++ {
			if k := fmt.Sprintf("%s-neighbour-%d", key, i); bucketOf(k) == bucketOf(key) {
				claim(k, retention)
				return
			}
		}
	}
	x, y, w, z := "x", "y", "w", "z"
	seen := map[string]bool{}
	for _, k := range []string{x, y, w, z} {
		if seen[bucketOf(k)] {
			t.Fatalf("%s shares a bucket with another key of the test; pick other keys", k)
		}
		seen[bucketOf(k)] = true
	}
	bucketWith(x, time.Hour)        // x: new, in a bucket with hours left
	yFence := claim(y, time.Minute) // y: its bucket made for a minute's claim
	wFence := claim(w, time.Hour)   // w: an hour's claim, its value flagged so
	bucketWith(z, time.Minute)      // z: new, in a bucket with minutes left
	keys := []string{x, y, w, z}
	outcomes, errs := run(ctx, keys, []uint64{0, yFence, wFence, 0}, []byte("done")) // completions for an hour
	for i := range keys {
		if errs[i] != nil {
			t.Fatalf("call %d (%s): %v", i, keys[i], errs[i])
		}
	}
	if outcomes[0] != store.Acquired || outcomes[3] != store.Acquired {
		t.Fatalf("acquisitions of x and z: %v, %v", outcomes[0], outcomes[3])
	}
	for _, k := range keys {
		rec, err := s.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		expiry, err := s.Client().PExpireTime(ctx, bucketOf(k)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if until := time.UnixMilli(expiry.Milliseconds()); until.Before(rec.ExpiresAt) {
			t.Errorf("%s's bucket expires at %v, before its record (%v): the record would go with it",
				k, until.Format(time.RFC3339Nano), rec.ExpiresAt.Format(time.RFC3339Nano))
		}
	}
}
