package redisstore_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/redisstore"
)

// releaseScripts reads the acquire and owned scripts of an earlier release
// kept in testdata/dir.
func releaseScripts(t *testing.T, dir string) (acquire, owned string) {
	t.Helper()
	read := func(name string) string {
		b, err := os.ReadFile("testdata/" + dir + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	return read("acquire.lua"), read("owned.lua")
}

// awaitServerClock returns once the server's clock (TIME, which the scripts
// read) has moved on by d since the call.
func awaitServerClock(t *testing.T, c redis.UniversalClient, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	start, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for {
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.Sub(start) >= d {
			return
		}
	}
}

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
	oldAcquire, oldOwned := releaseScripts(t, "first-encoding")
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
	awaitServerClock(t, c, 2*time.Millisecond) // the 1 ms lease of "lease-over" runs out

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

// TestRecordsOfTheSecondEncoding: records the previous release wrote into
// its buckets (format 2, by its scripts in testdata/second-encoding) are
// read and decided on by this release. This release's first write into a
// bucket moves the old bucket's live records into its own (format 3, fences
// kept exactly, also those too far from the clock for the short form) and
// leaves the old bucket a marker string, on which the previous release's
// scripts fail (WRONGTYPE) for every key of the bucket — a fresh key too —
// rather than take a claim beside a record they would not see.
func TestRecordsOfTheSecondEncoding(t *testing.T) {
	s := openBuckets(t, testenv.RandomName("idemtest:")+":") // one bucket a slot
	ctx := context.Background()
	c := s.Client()
	oldAcquire, oldOwned := releaseScripts(t, "second-encoding")

	// Keys of one bucket, named for their role.
	keys0, _ := s.Locate("completed")
	bucket, previous := keys0[1], keys0[2]
	name := map[string]string{}
	roles := []string{"completed", "failed", "released", "in-flight", "lease-over", "mismatch", "expired",
		"far-fence", "near-zero-fence", "old-after-read", "new", "late"}
	for i, n := 0, 0; n < len(roles); i++ {
		k := fmt.Sprintf("%s-%d", roles[n], i)
		if keys, _ := s.Locate(k); keys[2] == previous {
			name[roles[n]] = k
			n++
		}
	}
	oldCall := func(src, role string, args ...any) *redis.Cmd {
		keys, field := s.Locate(name[role])
		return c.Eval(ctx, src, []string{keys[0], keys[2]}, append([]any{field}, args...)...)
	}
	fp := idem.Fingerprint([]byte("body"))
	encodedFP := redisstore.EncodeFingerprint(fp) // as the store sends it to its scripts
	fences := map[string]uint64{}
	calls := 0
	nonce := func() string { calls++; return fmt.Sprintf("old%07d", calls) } // 10 bytes, as the store's
	claim := func(role string, lease, keep int64) {
		t.Helper()
		v, err := oldCall(oldAcquire, role, encodedFP, lease, keep, 0, nonce()).Slice()
		if err != nil || v[0] != int64(idem.Acquired) {
			t.Fatalf("old acquire of %s: %v %v", role, v, err)
		}
		p := v[1].(string)
		if p[0]&0x80 == 0 {
			t.Fatalf("old acquire of %s wrote %x: not format 2", role, p)
		}
		fences[role] = uint64(p[1])<<48 | binary.BigEndian.Uint64([]byte("\x00\x00"+p[2:8]))
	}
	settle := func(role, op, result string) {
		t.Helper()
		n, err := oldCall(oldOwned, role, op, strconv.FormatUint(fences[role], 10), 3600000, result, nonce()).Int()
		if err != nil || n != 1 {
			t.Fatalf("old %s of %s: %d %v", op, role, n, err)
		}
	}
	for _, r := range []string{"completed", "failed", "released", "in-flight", "mismatch", "far-fence", "near-zero-fence"} {
		claim(r, 60000, 3600000)
	}
	claim("lease-over", 1, 3600000)
	claim("expired", 1, 1)
	settle("completed", "c", `{"status":201,"id":"B-0001"}`)
	settle("mismatch", "c", "x")
	settle("failed", "f", "declined")
	settle("released", "x", "")
	// Fences the short form cannot hold: far above the clock (as after a
	// clock step back; below 2^53, which Lua's numbers hold exactly) and far
	// below it (as of a claim taken more than 71 minutes ago).
	for role, fence := range map[string]uint64{"far-fence": 1<<52 + 12345, "near-zero-fence": 7} {
		_, field := s.Locate(name[role])
		if err := c.Eval(ctx, `local v = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], string.sub(v, 1, 1) .. struct.pack('>I7', tonumber(ARGV[2])) .. string.sub(v, 9))
return 1`,
			[]string{previous}, field, fence).Err(); err != nil {
			t.Fatal(err)
		}
		fences[role] = fence
	}
	awaitServerClock(t, c, 2*time.Millisecond) // the 1 ms lease of "lease-over" and retention of "expired" run out

	typeOf := func(k string) string {
		tp, err := c.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tp
	}
	if typeOf(previous) != "hash" || typeOf(bucket) != "none" {
		t.Fatalf("before this release wrote: the old bucket is a %s, the new one a %s", typeOf(previous), typeOf(bucket))
	}

	want := map[string]idem.State{"completed": idem.StateCompleted, "failed": idem.StateFailed, "released": idem.StateReleased,
		"in-flight": idem.StateInFlight, "lease-over": idem.StateInFlight, "mismatch": idem.StateCompleted,
		"far-fence": idem.StateInFlight, "near-zero-fence": idem.StateInFlight}
	reads := func(when string) {
		t.Helper()
		for role, st := range want {
			rec, err := s.Get(ctx, name[role])
			if err != nil || rec.State != st || rec.Fence != fences[role] || rec.Fingerprint != fp || rec.Attempts != 1 {
				t.Fatalf("%s: Get(%s) = %+v, %v; want state %v fence %d", when, role, rec, err, st, fences[role])
			}
		}
		if rec, _ := s.Get(ctx, name["completed"]); string(rec.Result) != `{"status":201,"id":"B-0001"}` {
			t.Fatalf("%s: completed result %q", when, rec.Result)
		}
		if _, err := s.Get(ctx, name["expired"]); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("%s: Get of an expired record: %v", when, err)
		}
		recs, _, err := s.Scan(ctx, "", 100)
		if err != nil || len(recs) != len(want) {
			t.Fatalf("%s: Scan: %d records, %v; want %d", when, len(recs), err, len(want))
		}
		listed, err := s.List(ctx, "", 0)
		if err != nil || len(listed) != len(want) {
			t.Fatalf("%s: List: %d records, %v; want %d", when, len(listed), err, len(want))
		}
	}
	reads("read from the old bucket")
	// Reads do not write: the previous release still works beside this one.
	claim("old-after-read", 60000, 3600000)
	want["old-after-read"] = idem.StateInFlight

	// This release's first write into the bucket moves it: the new bucket
	// lasts as long as the records it takes over need, whatever the old
	// bucket's TTL (here none: an operator's PERSIST) and the writing
	// record's retention (a minute, where theirs are an hour).
	if err := c.Persist(ctx, previous).Err(); err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(ctx, idem.AcquireRequest{Key: name["new"], Fingerprint: fp, Lease: time.Minute, Retention: time.Minute})
	if err != nil || a.Outcome != idem.Acquired {
		t.Fatalf("a new key: %v %v", a.Outcome, err)
	}
	fences["new"], want["new"] = a.Fence, idem.StateInFlight
	if typeOf(previous) != "string" {
		t.Fatalf("after this release wrote: the old bucket is a %s, want the marker", typeOf(previous))
	}
	values, err := c.HGetAll(ctx, bucket).Result()
	delete(values, "") // the time of the next sweep, if one looked
	if err != nil || len(values) != len(want) {
		t.Fatalf("the new bucket holds %d records (%v), want the %d live ones", len(values), err, len(want))
	}
	for role := range want {
		_, field := s.Locate(name[role])
		v := values[field]
		short := role != "far-fence" && role != "near-zero-fence"
		if v == "" || v[0]&0x80 != 0 || (v[0]&16 != 0) != short {
			t.Fatalf("%s in the new bucket: %x, want format 3 with the fence's short form %v", role, v, short)
		}
	}
	bucketExpiry := c.PExpireTime(ctx, bucket).Val()
	if old, err := c.PExpireTime(ctx, previous).Result(); err != nil || old != bucketExpiry {
		t.Fatalf("the marker expires at %v (%v), the bucket at %v: want the same", old, err, bucketExpiry)
	}
	for role := range want {
		rec, err := s.Get(ctx, name[role])
		if err != nil || rec.ExpiresAt.After(time.UnixMilli(0).Add(bucketExpiry)) {
			t.Fatalf("%s expires at %v (%v), after its bucket (%v)", role, rec.ExpiresAt, err, time.UnixMilli(0).Add(bucketExpiry))
		}
	}
	reads("moved to the new bucket")

	// The previous release now fails closed on every key of the bucket.
	for _, role := range []string{"completed", "late"} {
		if err := oldCall(oldAcquire, role, encodedFP, 60000, 3600000, 0, nonce()).Err(); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Fatalf("the previous release acquired %s after the move: %v, want WRONGTYPE", role, err)
		}
	}
	if err := oldCall(oldOwned, "old-after-read", "c", strconv.FormatUint(fences["old-after-read"], 10), 3600000, "r", nonce()).Err(); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("the previous release completed a claim after the move: %v, want WRONGTYPE", err)
	}
	if _, err := s.Get(ctx, name["late"]); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("the previous release's failed call left a record: %v", err)
	}

	// Decisions on the moved records.
	acquire := func(role, fingerprint string) idem.Acquisition {
		t.Helper()
		a, err := s.Acquire(ctx, idem.AcquireRequest{Key: name[role], Fingerprint: fingerprint, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if a := acquire("completed", fp); a.Outcome != idem.Replayed || a.Record.Fence != fences["completed"] {
		t.Fatalf("a duplicate of a moved completed record: %v %+v", a.Outcome, a.Record)
	}
	if a := acquire("mismatch", idem.Fingerprint([]byte("other body"))); a.Outcome != idem.Mismatch {
		t.Fatalf("another payload under a moved key: %v", a.Outcome)
	}
	if a := acquire("in-flight", fp); a.Outcome != idem.InProgress {
		t.Fatalf("a moved live claim: %v", a.Outcome)
	}
	for _, role := range []string{"in-flight", "old-after-read", "far-fence", "near-zero-fence"} {
		if err := s.Heartbeat(ctx, name[role], fences[role], time.Minute); err != nil {
			t.Fatalf("the owner of the moved claim %s heartbeats: %v", role, err)
		}
		if err := s.Complete(ctx, name[role], fences[role], []byte("done"), time.Hour); err != nil {
			t.Fatalf("the owner of the moved claim %s completes: %v", role, err)
		}
		if a := acquire(role, fp); a.Outcome != idem.Replayed || string(a.Record.Result) != "done" || a.Record.Fence != fences[role] {
			t.Fatalf("after the moved claim %s completed: %v %+v", role, a.Outcome, a.Record)
		}
	}
	if a := acquire("lease-over", fp); a.Outcome != idem.TakenOver || a.Fence <= fences["lease-over"] || a.Record.Attempts != 2 {
		t.Fatalf("a moved claim whose lease ran out: %v fence %d (old %d)", a.Outcome, a.Fence, fences["lease-over"])
	}
	if err := s.Complete(ctx, name["lease-over"], fences["lease-over"], []byte("zombie"), time.Hour); err != idem.ErrStaleFence {
		t.Fatalf("the old owner after the takeover: %v", err)
	}
	if a := acquire("released", fp); a.Outcome != idem.Acquired || a.Fence <= fences["released"] {
		t.Fatalf("a moved released record: %v fence %d", a.Outcome, a.Fence)
	}
	if err := s.Delete(ctx, name["completed"]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, name["completed"]); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
}

// rollout has workers claim and complete keys at once, each in an order
// of its own, and records who claimed each key: a worker is a Store of
// this release, or nil for the previous release (its bucket scripts,
// testdata/second-encoding, called through c).
type rollout struct {
	t                    *testing.T
	c                    redis.UniversalClient
	names                *redisstore.Store // names the keys' locations
	oldAcquire, oldOwned *redis.Script
	fp                   string
	nonces               atomic.Int64

	mu     sync.Mutex
	claims map[string][]string // key: who claimed it ("new", "old")
	// Calls of the previous release: acquisitions refused (WRONGTYPE, the
	// bucket moved), claims it could not settle (it moved while it held
	// them), claims it completed.
	oldRefused, oldStuck, oldDone int
}

func newRollout(t *testing.T, s *redisstore.Store) *rollout {
	acquireSrc, ownedSrc := releaseScripts(t, "second-encoding")
	return &rollout{t: t, c: s.Client(), names: s, oldAcquire: redis.NewScript(acquireSrc), oldOwned: redis.NewScript(ownedSrc),
		fp: idem.Fingerprint([]byte("body")), claims: map[string][]string{}}
}

func mustLocate(s *redisstore.Store, key string) []string {
	keys, _ := s.Locate(key)
	return keys
}

// keysIn returns n keys (named by tag) of four buckets: those in buckets,
// to which it adds the first buckets it meets while it holds fewer.
func (r *rollout) keysIn(n int, tag string, buckets map[string]bool) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprintf("rollout-%s-%d", tag, i)
		loc, _ := r.names.Locate(k)
		if !buckets[loc[1]] && len(buckets) == 4 {
			continue
		}
		buckets[loc[1]] = true
		keys = append(keys, k)
	}
	return keys
}

func (r *rollout) run(workers []*redisstore.Store, keys []string) {
	var wg sync.WaitGroup
	for w, s := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			order := slices.Clone(keys)
			rand.New(rand.NewPCG(uint64(w), uint64(len(keys)))).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			for _, k := range order {
				if !r.claim(s, k) {
					return
				}
			}
		}()
	}
	wg.Wait()
}

// claim has s (nil: the previous release) claim k and complete it if it
// got the claim; false on an unexpected error.
func (r *rollout) claim(s *redisstore.Store, k string) bool {
	t, ctx := r.t, context.Background()
	count := func(n *int) { r.mu.Lock(); *n++; r.mu.Unlock() }
	claimed := func(who string) { r.mu.Lock(); r.claims[k] = append(r.claims[k], who); r.mu.Unlock() }
	if s != nil {
		a, err := s.Acquire(ctx, idem.AcquireRequest{Key: k, Fingerprint: r.fp, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Error(err)
			return false
		}
		if a.Outcome == idem.Acquired || a.Outcome == idem.TakenOver {
			claimed("new")
			if err := s.Complete(ctx, k, a.Fence, []byte("done"), time.Hour); err != nil {
				t.Error(err)
				return false
			}
		}
		return true
	}
	loc, field := r.names.Locate(k)
	old := []string{loc[0], loc[2]}
	v, err := r.oldAcquire.Run(ctx, r.c, old, field, redisstore.EncodeFingerprint(r.fp), 60000, 3600000, 0, fmt.Sprintf("o%09d", r.nonces.Add(1))).Slice()
	if err != nil {
		if !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Error(err)
			return false
		}
		count(&r.oldRefused)
		return true
	}
	if v[0] != int64(idem.Acquired) && v[0] != int64(idem.TakenOver) {
		return true
	}
	claimed("old")
	p := v[1].(string)
	fence := uint64(p[1])<<48 | binary.BigEndian.Uint64([]byte("\x00\x00"+p[2:8]))
	n, err := r.oldOwned.Run(ctx, r.c, old, field, "c", strconv.FormatUint(fence, 10), 3600000, "done", fmt.Sprintf("o%09d", r.nonces.Add(1))).Int()
	switch {
	case err != nil && strings.Contains(err.Error(), "WRONGTYPE"):
		// Its bucket moved while it held the claim: the claim stays in
		// flight (moved with the bucket) for its lease.
		count(&r.oldStuck)
	case err != nil || n != 1:
		t.Errorf("old complete of %s: %d %v", k, n, err)
		return false
	default:
		count(&r.oldDone)
	}
	return true
}

// check fails the test for a key claimed more or less than once, or not
// completed (in flight where the previous release could not settle it,
// when stuck allows it).
func (r *rollout) check(keys []string, stuck bool) {
	t, ctx := r.t, context.Background()
	t.Helper()
	for _, k := range keys {
		if len(r.claims[k]) != 1 {
			t.Errorf("%s claimed %d times: %v", k, len(r.claims[k]), r.claims[k])
		}
		rec, err := r.names.Get(ctx, k)
		if err != nil || (rec.State != idem.StateCompleted && !(stuck && rec.State == idem.StateInFlight)) {
			t.Errorf("%s: %+v %v", k, rec, err)
		}
	}
}

// bucketTypes returns the types of the buckets of keys: this release's
// names and the previous release's.
func (r *rollout) bucketTypes(keys []string) (current, previous map[string]bool) {
	current, previous = map[string]bool{}, map[string]bool{}
	for _, k := range keys {
		loc, _ := r.names.Locate(k)
		current[r.c.Type(context.Background(), loc[1]).Val()] = true
		previous[r.c.Type(context.Background(), loc[2]).Val()] = true
	}
	return current, previous
}

// TestRolloutBesideThePreviousRelease: processes of the previous release
// (its bucket scripts) and of this one claim and complete the same keys at
// once, in a few buckets (the previous release alone on half of them
// first), while this release's writes move those buckets:
// no key is claimed twice — the previous release's calls on a moved bucket
// fail (WRONGTYPE), closed — and every key ends completed once (or in
// flight, where the previous release held the claim as its bucket moved).
func TestRolloutBesideThePreviousRelease(t *testing.T) {
	s := openBuckets(t, testenv.RandomName("idemtest:")+":")
	r := newRollout(t, s)
	keys := r.keysIn(240, "a", map[string]bool{})
	// The previous release alone on half the keys, then both on all.
	r.run([]*redisstore.Store{nil, nil, nil, nil, nil, nil, nil, nil}, keys[:120])
	r.run([]*redisstore.Store{s, nil, s, nil, s, nil, s, nil, s, nil, s, nil, s, nil, s, nil}, keys)
	r.check(keys, true)
	if _, previous := r.bucketTypes(keys); len(previous) != 1 || !previous["string"] {
		t.Errorf("the previous names of the buckets are of types %v, want the marker (a string)", previous)
	}
	t.Logf("240 keys in 4 buckets: %d completed by the previous release, %d of its calls refused (WRONGTYPE), %d claims it could not settle",
		r.oldDone, r.oldRefused, r.oldStuck)
}

// TestRollingUpgradeFromThePreviousRelease: the two steps of a rolling
// upgrade (Config.WritePreviousBuckets). First, processes of the previous
// release run beside this release's with the option, on the same keys at
// once: no key is claimed twice, none of the previous release's calls
// fails and every claim it takes settles — the buckets stay the previous
// release's. Then, with the previous release gone, processes of this
// release with the option and without it (restarting one by one) on those
// keys and more of the same buckets: the buckets move, no key is claimed
// twice, every key ends completed.
func TestRollingUpgradeFromThePreviousRelease(t *testing.T) {
	prefix := testenv.RandomName("idemtest:") + ":"
	s := openBuckets(t, prefix)
	during := testenv.OpenRedisConfig(t, "", redisstore.Config{Prefix: prefix, Buckets: 1, WritePreviousBuckets: true})
	r := newRollout(t, s)
	buckets := map[string]bool{}
	keys := r.keysIn(240, "a", buckets)

	// A key of a bucket of its own, written by this release alone: the
	// previous release replays it, and its bucket (the previous release's)
	// outlives it.
	ctx := context.Background()
	alone := "rollout-alone"
	for i := 0; buckets[mustLocate(s, alone)[1]]; i++ {
		alone = fmt.Sprintf("rollout-alone-%d", i)
	}
	a, err := during.Acquire(ctx, idem.AcquireRequest{Key: alone, Fingerprint: r.fp, Lease: time.Minute, Retention: time.Hour})
	if err != nil || a.Outcome != idem.Acquired {
		t.Fatalf("acquire: %+v %v", a, err)
	}
	if err := during.Complete(ctx, alone, a.Fence, []byte("result"), 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	loc, field := s.Locate(alone)
	v, err := r.oldAcquire.Run(ctx, r.c, []string{loc[0], loc[2]}, field, redisstore.EncodeFingerprint(r.fp), 60000, 3600000, 0, "old0000001").Slice()
	if err != nil || v[0] != int64(idem.Replayed) {
		t.Fatalf("the previous release's acquire of a key this release completed: %v %v, want a replay", v, err)
	}
	if rec, ok := redisstore.DecodeRecord(v[1].(string)); !ok || string(rec.Result) != "result" || rec.Fence != a.Fence {
		t.Fatalf("the previous release read %+v", rec)
	}
	if ttl := r.c.PExpireTime(ctx, loc[2]).Val(); ttl < time.Duration(time.Now().Add(2*time.Hour).UnixMilli())*time.Millisecond {
		t.Fatalf("the previous release's bucket expires at %d ms (-1: never), before the record it holds", ttl.Milliseconds())
	}
	if tp := r.c.Type(ctx, loc[1]).Val(); tp != "none" {
		t.Fatalf("this release's bucket is a %s: made while writing into the previous release's", tp)
	}

	r.run([]*redisstore.Store{during, nil, during, nil, during, nil, during, nil, during, nil, during, nil, during, nil, during, nil}, keys)
	r.check(keys, false)
	if r.oldRefused != 0 || r.oldStuck != 0 || r.oldDone == 0 {
		t.Errorf("beside this release with WritePreviousBuckets, the previous release had %d acquisitions refused and %d claims it could not settle, completed %d",
			r.oldRefused, r.oldStuck, r.oldDone)
	}
	if current, previous := r.bucketTypes(keys); len(current) != 1 || !current["none"] || len(previous) != 1 || !previous["hash"] {
		t.Errorf("during the upgrade: buckets of types %v, the previous release's %v; want none and hashes", current, previous)
	}
	// Each bucket of the previous release outlives its records, whoever
	// wrote them (its TTL kept as that release keeps it).
	for _, k := range keys {
		loc, field := s.Locate(k)
		v, err := r.c.HGet(context.Background(), loc[2], field).Result()
		if err != nil {
			t.Fatalf("%s: not in the previous release's bucket: %v", k, err)
		}
		rec, ok := redisstore.DecodeRecord(v)
		ttl, _ := r.c.PExpireTime(context.Background(), loc[2]).Result()
		if !ok || v[0]&0x80 == 0 || time.UnixMilli(int64(ttl/time.Millisecond)).Before(rec.ExpiresAt) {
			t.Errorf("%s: value %x (format 2: %v) expiring at %v in a bucket expiring at %v", k, v, v[0]&0x80 != 0, rec.ExpiresAt, ttl)
		}
	}
	t.Logf("step 1: %d keys completed by the previous release, %d by this one", r.oldDone, len(keys)-r.oldDone)

	more := r.keysIn(240, "b", buckets)
	all := append(slices.Clone(keys), more...)
	for _, k := range keys {
		delete(r.claims, k) // claimed again only if a record was lost
	}
	r.run([]*redisstore.Store{during, s, during, s, during, s, during, s}, all)
	for _, k := range keys {
		if len(r.claims[k]) != 0 {
			t.Errorf("%s, completed in step 1, claimed again: %v", k, r.claims[k])
		}
		r.claims[k] = []string{"step 1"}
	}
	r.check(all, false)
	if current, previous := r.bucketTypes(all); len(current) != 1 || !current["hash"] || len(previous) != 1 || !previous["string"] {
		t.Errorf("after the upgrade: buckets of types %v, the previous release's %v; want hashes and the marker", current, previous)
	}
}

// TestRetiredPreviousReleaseLeavesNoMarker: with
// Config.PreviousReleaseRetired a bucket keeps no marker under its previous
// name — not where it is new, not where it moves a previous release's
// bucket (whose records it still reads and takes over), and a marker left
// before goes at the bucket's next TTL extension — while a store without
// the option leaves one.
func TestRetiredPreviousReleaseLeavesNoMarker(t *testing.T) {
	prefix := testenv.RandomName("idemtest:") + ":"
	retired := testenv.OpenRedisConfig(t, "", redisstore.Config{Prefix: prefix, Buckets: 1, PreviousReleaseRetired: true})
	marking := openBuckets(t, prefix)
	ctx := context.Background()
	c := retired.Client()
	oldAcquire, oldOwned := releaseScripts(t, "second-encoding")
	// Not with the rollout's first step: its processes of both releases run
	// side by side, and where this release's bucket exists the marker keeps
	// the previous release's calls from claiming beside it.
	if _, err := redisstore.New(redisstore.Config{Client: c, Prefix: prefix, Buckets: 1, WritePreviousBuckets: true, PreviousReleaseRetired: true}); err == nil {
		t.Fatal("PreviousReleaseRetired with WritePreviousBuckets: accepted")
	}
	typeOf := func(k string) string {
		t.Helper()
		tp, err := c.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tp
	}
	fp := idem.Fingerprint([]byte("body"))
	lifecycle := func(s *redisstore.Store, key string, retention time.Duration) {
		t.Helper()
		a, err := s.Acquire(ctx, idem.AcquireRequest{Key: key, Fingerprint: fp, Lease: time.Minute, Retention: retention})
		if err == nil && a.Outcome != idem.Acquired {
			err = fmt.Errorf("outcome %v", a.Outcome)
		}
		if err == nil {
			err = s.Complete(ctx, key, a.Fence, []byte("done"), retention)
		}
		if err != nil {
			t.Fatalf("lifecycle of %s: %v", key, err)
		}
	}
	// keyInBucketOf returns a key (named tag-N) in the bucket of key.
	keyInBucketOf := func(key, tag string) string {
		want, _ := retired.Locate(key)
		for i := 0; ; i++ {
			k := fmt.Sprintf("%s-%d", tag, i)
			if keys, _ := retired.Locate(k); keys[1] == want[1] {
				return k
			}
		}
	}
	// A key of a bucket of its own (one bucket a slot: a slot of its own).
	slots := map[string]bool{}
	keyOfNewBucket := func(tag string) (key, previous string) {
		for i := 0; ; i++ {
			key = fmt.Sprintf("%s-%d", tag, i)
			keys, _ := retired.Locate(key)
			if !slots[keys[1]] {
				slots[keys[1]] = true
				return key, keys[2]
			}
		}
	}

	// A new bucket: no marker with the option, one without.
	fresh, freshPrevious := keyOfNewBucket("fresh")
	lifecycle(retired, fresh, time.Hour)
	if tp := typeOf(freshPrevious); tp != "none" {
		t.Fatalf("a new bucket of the retired store left a %s under its previous name, want none", tp)
	}
	marked, markedPrevious := keyOfNewBucket("marked")
	lifecycle(marking, marked, time.Hour)
	if tp := typeOf(markedPrevious); tp != "string" {
		t.Fatalf("a new bucket of the marking store left a %s under its previous name, want the marker", tp)
	}
	// That marker goes when the retired store next extends the bucket's
	// TTL (a retention longer than the bucket's).
	lifecycle(retired, keyInBucketOf(marked, "later"), 48*time.Hour)
	if tp := typeOf(markedPrevious); tp != "none" {
		t.Fatalf("after the retired store extended the bucket's TTL, its previous name holds a %s, want none", tp)
	}

	// A previous release's bucket: read, then moved by the first write,
	// without a marker.
	old, oldPrevious := keyOfNewBucket("old")
	keys, field := retired.Locate(old)
	oldCall := func(src string, args ...any) *redis.Cmd {
		return c.Eval(ctx, src, []string{keys[0], keys[2]}, append([]any{field}, args...)...)
	}
	v, err := oldCall(oldAcquire, redisstore.EncodeFingerprint(fp), 60000, 3600000, 0, "old0000001").Slice()
	if err != nil || v[0] != int64(idem.Acquired) {
		t.Fatalf("old acquire: %v %v", v, err)
	}
	p := v[1].(string)
	fence := uint64(p[1])<<48 | binary.BigEndian.Uint64([]byte("\x00\x00"+p[2:8]))
	if n, err := oldCall(oldOwned, "c", strconv.FormatUint(fence, 10), 3600000, "old result", "old0000002").Int(); err != nil || n != 1 {
		t.Fatalf("old complete: %d %v", n, err)
	}
	check := func(when string) {
		t.Helper()
		rec, err := retired.Get(ctx, old)
		if err != nil || rec.State != idem.StateCompleted || rec.Fence != fence || string(rec.Result) != "old result" {
			t.Fatalf("%s: Get = %+v, %v; want completed under fence %d with the old result", when, rec, err, fence)
		}
	}
	check("in the previous release's bucket")
	lifecycle(retired, keyInBucketOf(old, "another"), time.Hour)
	if tp := typeOf(oldPrevious); tp != "none" {
		t.Fatalf("after the move, the previous release's bucket is a %s, want none", tp)
	}
	if in, err := c.HExists(ctx, keys[1], field).Result(); err != nil || !in {
		t.Fatalf("the old record is not in the new bucket: %v %v", in, err)
	}
	check("moved into the new bucket")
	if a, err := retired.Acquire(ctx, idem.AcquireRequest{Key: old, Fingerprint: fp, Lease: time.Minute, Retention: time.Hour}); err != nil || a.Outcome != idem.Replayed || string(a.Record.Result) != "old result" {
		t.Fatalf("a duplicate of the moved record: %v %v", a.Outcome, err)
	}
}
