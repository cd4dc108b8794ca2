package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/redisstore"
	"github.com/idemgo/idem/store/storetest"
	"github.com/idemgo/idem/store/storeurl"
)

func openBuckets(t testing.TB, prefix string) *redisstore.Store {
	return testenv.OpenRedisConfig(t, "", redisstore.Config{Prefix: prefix, Buckets: 1})
}

// TestConformanceBuckets runs the suite on records kept in buckets
// (Config.Buckets), coalesced and not.
func TestConformanceBuckets(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: TestConformance runs the suite; this runs it on buckets")
	}
	caps := storetest.Capabilities{Unclaims: true, FencedDeletes: true, ListsRecords: true, SelfExpiring: true}
	t.Run("Coalesced", func(t *testing.T) {
		storetest.Run(t, caps, func(t testing.TB) store.Store { return openBuckets(t, testenv.RandomName("idemtest:")+":") })
	})
	t.Run("Uncoalesced", func(t *testing.T) {
		storetest.Run(t, caps, func(t testing.TB) store.Store {
			return testenv.OpenRedisConfig(t, "", redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":", Buckets: 1, NoCoalesce: true})
		})
	})
}

func TestMultiProcessBuckets(t *testing.T) {
	testenv.RedisClient(t).Close()
	storetest.MultiProcess(t, "TestMultiProcessBuckets", testenv.RandomName("idemtest:")+":", 4, 200,
		func(t testing.TB, prefix string) store.Store { return openBuckets(t, prefix) })
}

func TestCrashTakeoverBuckets(t *testing.T) {
	testenv.RedisClient(t).Close()
	storetest.CrashTakeover(t, "TestCrashTakeoverBuckets", testenv.RandomName("idemtest:")+":",
		func(t testing.TB, prefix string) store.Store { return openBuckets(t, prefix) })
}

// TestBucketSlots: every slot has a tag without braces, and a bucket's name
// is in the slot of its record's own key name, as this package computes
// slots (TestCluster/BucketSlotsAreRedis checks them against Redis's).
func TestBucketSlots(t *testing.T) {
	for slot := range 16384 {
		tag := redisstore.SlotTag(slot)
		if strings.ContainsAny(tag, "{}") || redisstore.KeySlot(tag) != slot {
			t.Fatalf("slot %d: tag %q hashes to %d", slot, tag, redisstore.KeySlot(tag))
		}
	}
	s := openBuckets(t, testenv.RandomName("idemtest:")+":")
	for _, k := range bucketSlotKeys {
		keys, _ := s.Locate(k)
		if redisstore.KeySlot(keys[1]) != redisstore.KeySlot(keys[0]) {
			t.Fatalf("%q: the bucket %q is in slot %d, the record's own key %q in %d", k, keys[1], redisstore.KeySlot(keys[1]), keys[0], redisstore.KeySlot(keys[0]))
		}
	}
}

// bucketSlotKeys are storage keys of every kind, braces included.
var bucketSlotKeys = []string{"k", "1~AAAAAAAAAAAAAAAAAAAAAA", "POST /x\x1fa-b", strings.Repeat("é", 40), "a}b{c", "{}", "}"}

// TestBucketPlacement: a record lives in its bucket, with no key of its
// own; one too large for a bucket (a long key, a long result) keeps a key
// of its own; and a record moves between the two as it changes.
func TestBucketPlacement(t *testing.T) {
	s := openBuckets(t, testenv.RandomName("idemtest:")+":")
	ctx := context.Background()
	c := s.Client()
	where := func(key string) string {
		keys, field := s.Locate(key)
		own, err := c.Exists(ctx, keys[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		inBucket, err := c.HExists(ctx, keys[1], field).Result()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case own == 1 && inBucket:
			return "both"
		case own == 1:
			return "own key"
		case inBucket:
			return "bucket"
		}
		return "nowhere"
	}
	compact := store.CompactKey("POST /bookings", "0f8fad5b-d9cb-469f-a165-70867728950e")
	long := strings.Repeat("k", 100)
	small, large := []byte(`{"status":201,"id":"B-0001"}`), []byte(strings.Repeat("r", 200))
	for _, c := range []struct {
		key    string
		result []byte
		want   string
	}{
		{compact, small, "bucket"},
		{"short raw key", small, "bucket"},
		{long, small, "own key"},
		{compact + "x", large, "own key"},
	} {
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: c.key, Fingerprint: idem.Fingerprint(c.result), Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if got := where(c.key); got != "bucket" && c.key != long {
			t.Fatalf("%.30q in flight: in %s, want its bucket", c.key, got)
		}
		if err := s.Complete(ctx, c.key, a.Fence, c.result, time.Hour); err != nil {
			t.Fatal(err)
		}
		if got := where(c.key); got != c.want {
			t.Fatalf("%.30q completed with a %d-byte result: in %s, want %s", c.key, len(c.result), got, c.want)
		}
		r, err := s.Acquire(ctx, store.AcquireRequest{Key: c.key, Fingerprint: idem.Fingerprint(c.result), Lease: time.Minute, Retention: time.Hour})
		if err != nil || r.Outcome != store.Replayed || string(r.Record.Result) != string(c.result) || r.Record.Attempts != 1 || r.Record.Fence != a.Fence {
			t.Fatalf("%.30q replay: %v %+v %v", c.key, r.Outcome, r.Record, err)
		}
	}
	// More attempts than a bucket's record counts (255): the record moves
	// to a key of its own, and back when a new generation starts.
	var fence uint64
	for i := 1; i <= 256; i++ {
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: "retried", Lease: time.Minute, Retention: time.Hour})
		if err != nil || a.Record.Attempts != i {
			t.Fatalf("attempt %d: %+v %v", i, a.Record, err)
		}
		if got, want := where("retried"), map[bool]string{true: "own key", false: "bucket"}[i > 255]; got != want {
			t.Fatalf("attempt %d: in %s, want %s", i, got, want)
		}
		fence = a.Fence
		if i < 256 {
			if err := s.Release(ctx, "retried", a.Fence); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Delete(ctx, "retried"); err != nil || where("retried") != "nowhere" {
		t.Fatalf("Delete: %v, the record in %s", err, where("retried"))
	}
	if a, err := s.Acquire(ctx, store.AcquireRequest{Key: "retried", Lease: time.Minute, Retention: time.Hour}); err != nil || a.Fence <= fence || where("retried") != "bucket" {
		t.Fatalf("after Delete: fence %d (was %d), %v, in %s", a.Fence, fence, err, where("retried"))
	}
	if ttl, err := c.PTTL(ctx, func() string { keys, _ := s.Locate(compact); return keys[1] }()).Result(); err != nil || ttl < 59*time.Minute || ttl > 3*time.Hour { // at most three retentions (bucket.lua)
		t.Fatalf("bucket TTL %v %v, want the latest expiry of its records", ttl, err)
	}
}

// claimAll claims keys in s with req (key, lease): a minute's lease, 1 ms
// for "lease-over"; returns their fences.
func claimAll(t *testing.T, s *redisstore.Store, req func(string, time.Duration) store.AcquireRequest, keys ...string) map[string]uint64 {
	t.Helper()
	fences := map[string]uint64{}
	for _, k := range keys {
		lease := time.Minute
		if k == "lease-over" {
			lease = time.Millisecond
		}
		a, err := s.Acquire(context.Background(), req(k, lease))
		if err != nil {
			t.Fatal(err)
		}
		fences[k] = a.Fence
	}
	return fences
}

// takeOver waits for req to take over the claim of its key, taken with a
// 1 ms lease under fence, with a larger fence.
func takeOver(t *testing.T, s *redisstore.Store, req store.AcquireRequest, fence uint64) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, "a takeover of the claim whose 1 ms lease ran out", func() error {
		a, err := s.Acquire(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if a.Outcome != store.TakenOver || a.Fence <= fence {
			return fmt.Errorf("%v, fence %d", a.Outcome, a.Fence)
		}
		return nil
	})
}

// TestRecordsMoveIntoBuckets: records written by a store without buckets
// (under the same prefix) are read by one with buckets — Get, List, Scan, a
// replay, a mismatch, a settle of a claim taken before, a takeover — and
// each moves into its bucket at its next transition.
func TestRecordsMoveIntoBuckets(t *testing.T) {
	prefix := testenv.RandomName("idemtest:") + ":"
	before := testenv.OpenRedis(t, prefix)
	ctx := context.Background()
	req := func(k string, lease time.Duration) store.AcquireRequest {
		return store.AcquireRequest{Key: k, Fingerprint: idem.Fingerprint([]byte("body")), Lease: lease, Retention: time.Hour}
	}
	fences := claimAll(t, before, req, "completed", "in-flight", "lease-over", "mismatch")
	for _, k := range []string{"completed", "mismatch"} {
		if err := before.Complete(ctx, k, fences[k], []byte("r-"+k), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	after := openBuckets(t, prefix)
	recs, err := after.List(ctx, "", 0)
	if err != nil || len(recs) != 4 {
		t.Fatalf("List before any transition: %d records, %v", len(recs), err)
	}
	var scanned int
	for cursor := ""; ; {
		page, next, err := after.Scan(ctx, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		scanned += len(page)
		if cursor = next; cursor == "" {
			break
		}
	}
	if scanned != 4 {
		t.Fatalf("Scan: %d records, want 4", scanned)
	}
	if rec, err := after.Get(ctx, "completed"); err != nil || string(rec.Result) != "r-completed" {
		t.Fatalf("Get: %+v %v", rec, err)
	}
	if a, err := after.Acquire(ctx, req("completed", time.Minute)); err != nil || a.Outcome != store.Replayed {
		t.Fatalf("replay: %v %v", a.Outcome, err)
	}
	if a, err := after.Acquire(ctx, store.AcquireRequest{Key: "mismatch", Fingerprint: "other", Lease: time.Minute, Retention: time.Hour}); err != nil || a.Outcome != store.Mismatch {
		t.Fatalf("mismatch: %v %v", a.Outcome, err)
	}
	if err := after.Complete(ctx, "in-flight", fences["in-flight"], []byte("done after"), time.Hour); err != nil {
		t.Fatalf("the owner settles a claim taken before buckets: %v", err)
	}
	takeOver(t, after, req("lease-over", time.Minute), fences["lease-over"])
	c := after.Client()
	for k, moved := range map[string]bool{"completed": false, "mismatch": false, "in-flight": true, "lease-over": true} {
		keys, field := after.Locate(k)
		own, _ := c.Exists(ctx, keys[0]).Result()
		inBucket, _ := c.HExists(ctx, keys[1], field).Result()
		if moved && (own != 0 || !inBucket) || !moved && (own != 1 || inBucket) {
			t.Errorf("%s: own key %d, in its bucket %v; moved by a transition: %v", k, own, inBucket, moved)
		}
	}
	if rec, err := after.Get(ctx, "in-flight"); err != nil || rec.State != store.StateCompleted || string(rec.Result) != "done after" {
		t.Fatalf("moved record: %+v %v", rec, err)
	}
}

// TestBucketSweepsExpiredRecords: Redis cannot expire a field, so a bucket
// deletes its expired records when a new one arrives after its sweep time;
// live records stay. One new field in eight, by its fence (a clock reading),
// looks at the sweep time — not by the key, which a workload may end alike
// every time: the keys here all end in "/create", whose last byte would never
// have looked.
func TestBucketSweepsExpiredRecords(t *testing.T) {
	s := openBuckets(t, testenv.RandomName("idemtest:")+":")
	ctx := context.Background()
	c := s.Client()
	// Keys of one bucket: with 16,384 buckets, look for keys sharing one.
	keys, _ := s.Locate("k-0/create")
	bucket := keys[1]
	same := []string{"k-0/create"}
	for i := 1; len(same) < 150; i++ {
		k := fmt.Sprintf("k-%d/create", i)
		if ks, _ := s.Locate(k); ks[1] == bucket {
			same = append(same, k)
		}
	}
	next := 0 // the next unused key of same
	complete := func(retention time.Duration) string {
		k := same[next]
		next++
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, k, a.Fence, []byte("r"), retention); err != nil {
			t.Fatal(err)
		}
		return k
	}
	setSweepTime := func(ms int64) {
		b := []byte{byte(ms >> 40), byte(ms >> 32), byte(ms >> 24), byte(ms >> 16), byte(ms >> 8), byte(ms)}
		if err := c.HSet(ctx, bucket, "", string(b)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The bucket's sweep time an hour ahead before the first record: else
	// the second record's write may sweep the first (its write looks at the
	// sweep time when its fence says so, and a new bucket has none yet).
	setSweepTime(time.Now().Add(time.Hour).UnixMilli())
	expired := []string{complete(time.Millisecond), complete(time.Millisecond)}
	testenv.Eventually(t, 5*time.Second, "Redis's clock passing the 1 ms retention", func() error {
		for _, k := range expired {
			if _, err := s.Get(ctx, k); !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("%s: %v", k, err)
			}
		}
		return nil
	})
	present := func(k string) bool {
		_, field := s.Locate(k)
		in, err := c.HExists(ctx, bucket, field).Result()
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	var live []string
	for range 30 { // the sweep time has not come: nothing is swept
		live = append(live, complete(time.Hour))
	}
	if !present(expired[0]) || !present(expired[1]) {
		t.Fatal("expired records swept before the bucket's sweep time")
	}
	setSweepTime(0)
	for present(expired[0]) || present(expired[1]) {
		if next == len(same) { // one in eight looks: 118 new records without a sweep, p < 2e-7
			t.Fatalf("no sweep in %d new records after the sweep time", len(live)-30)
		}
		live = append(live, complete(time.Hour))
	}
	t.Logf("swept at the %d. new record after the sweep time", len(live)-30)
	for _, k := range live {
		if !present(k) {
			t.Fatalf("the sweep deleted live %s", k)
		}
	}
	if v, err := c.HGet(ctx, bucket, "").Result(); err != nil || len(v) != 6 || v[0] == 0 && v[1] == 0 {
		t.Fatalf("the next sweep time after a sweep: %q %v", v, err)
	}
}

// TestBucketsRefused: a Ring, or a prefix with a hash tag's brace.
func TestBucketsRefused(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:6379"}})
	defer ring.Close()
	if _, err := redisstore.New(redisstore.Config{Client: ring, Buckets: 1}); err == nil {
		t.Error("buckets on a Ring: accepted")
	}
	c := testenv.RedisClient(t)
	defer c.Close()
	if _, err := redisstore.New(redisstore.Config{Client: c, Prefix: "a{b}:", Buckets: 1}); err == nil {
		t.Error("buckets with a { in the prefix: accepted")
	}
}

func BenchmarkStoreBuckets(b *testing.B) {
	storetest.Bench(b, func(t testing.TB) store.Store { return openBuckets(t, testenv.RandomName("idemtest:")+":") })
}

// TestBucketsFromTheStoreURL: idem_buckets=N in a store URL turns buckets
// on; a value that is not a count is refused.
func TestBucketsFromTheStoreURL(t *testing.T) {
	ctx := context.Background()
	prefix := testenv.RandomName("idemtest:") + ":"
	testenv.OpenRedis(t, prefix) // its cleanup deletes the prefix's keys
	st, err := storeurl.Open(ctx, testenv.RedisURL+"?idem_buckets=20000&idem_prefix="+prefix, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := st.(*redisstore.Store)
	a, err := s.Acquire(ctx, store.AcquireRequest{Key: "k", Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k", a.Fence, []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	keys, field := s.Locate("k")
	if len(keys) != 2 || !strings.HasSuffix(keys[1], "$0") && !strings.HasSuffix(keys[1], "$1") {
		t.Fatalf("idem_buckets=20000: keys %q, want a bucket of the slot's two", keys)
	}
	if in, err := s.Client().HExists(ctx, keys[1], field).Result(); err != nil || !in {
		t.Fatalf("the record is not in its bucket: %v %v", in, err)
	}
	for _, bad := range []string{"x", "-1"} {
		if _, err := storeurl.Open(ctx, testenv.RedisURL+"?idem_buckets="+bad, nil); err == nil || !strings.Contains(err.Error(), "idem_buckets") {
			t.Errorf("idem_buckets=%s: %v, want it refused", bad, err)
		}
	}
}

// TestBucketSweepIsBounded: a bucket that grew large (too few buckets for
// the records: Redis then keeps it as a hash table) is swept a few hundred
// fields per call, continuing where the last call stopped, so no script
// walks the whole bucket at once; all expired records go in the end, and
// live ones stay.
func TestBucketSweepIsBounded(t *testing.T) {
	s := openBuckets(t, testenv.RandomName("idemtest:")+":")
	ctx := context.Background()
	c := s.Client()
	keys, _ := s.Locate("k")
	bucket := keys[1]
	// 3,000 expired records, written as the scripts write them (completed,
	// expired a minute ago), and the bucket's sweep time in the past.
	past := time.Now().Add(-time.Minute).UnixMilli()
	expired := make([]any, 0, 2*3000)
	for i := range 3000 {
		v := []byte{0x82, 0, 0, 0, 0, 0, 0, 1, 1, byte(past >> 40), byte(past >> 32), byte(past >> 24), byte(past >> 16), byte(past >> 8), byte(past), 0, 0, 0, 0, 0}
		expired = append(expired, fmt.Sprintf("\x00old-%d", i), string(v))
	}
	if err := c.HSet(ctx, bucket, expired...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, bucket, "", "\x00\x00\x00\x00\x00\x00").Err(); err != nil {
		t.Fatal(err)
	}
	fields := func() int64 {
		n, err := c.HLen(ctx, bucket).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var live []string
	j := 0 // the next candidate key
	before := fields()
	for i := 0; fields() > int64(len(live))+1; i++ { // until only the live records and the sweep time are left
		if i == 1000 {
			t.Fatalf("%d fields left after 1,000 new records", fields())
		}
		n := fields()
		k := ""
		for ; k == ""; j++ { // a new key of this bucket
			if ks, _ := s.Locate(fmt.Sprintf("live-%d", j)); ks[1] == bucket {
				k = fmt.Sprintf("live-%d", j)
			}
		}
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, k)
		if swept := n + 1 - fields(); swept > 1000 {
			t.Fatalf("one call swept %d fields of %d", swept, before)
		}
		if err := s.Complete(ctx, k, a.Fence, []byte("r"), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range live {
		if _, err := s.Get(ctx, k); err != nil {
			t.Fatalf("the sweep deleted live %s: %v", k, err)
		}
	}
	t.Logf("3,000 expired records swept in the course of %d new records", len(live))
}

// TestLocate: a record's own key, its bucket and its field, cut from one string, are what KeyName, the
// slot's tag and BucketField say, and the field maps back to the key.
func TestLocate(t *testing.T) {
	s := openBuckets(t, testenv.RandomName("idemtest:")+":")
	for _, k := range append([]string{"fifteen-bytes-k", "1~" + strings.Repeat("_", 22)}, bucketSlotKeys...) {
		keys, field := s.Locate(k)
		name := s.KeyName(k)
		bucket := strings.TrimSuffix(s.KeyName(""), "{}") + "{" + redisstore.SlotTag(redisstore.KeySlot(name)) + "}"
		want := []string{name, bucket + "$0"}
		if !slices.Equal(keys, want) || field != redisstore.BucketField(k) || redisstore.FieldKey(field) != k {
			t.Errorf("%q: keys %q field %q; want %q and %q", k, keys, field, want, redisstore.BucketField(k))
		}
	}
	// CRC-16/XMODEM's check value, which Redis's cluster spec quotes.
	if got := redisstore.KeySlot("123456789"); got != 0x31c3 {
		t.Errorf("slot of 123456789: %#x, want 0x31c3", got)
	}
}

// TestLocateAllocations: locating a record in its bucket allocates the
// keys' slice and one string for the three names.
func TestLocateAllocations(t *testing.T) {
	if raceDetector {
		t.Skip("the race detector allocates on its own account; .ci/run runs this without it")
	}
	s := openBuckets(t, testenv.RandomName("idemtest:")+":")
	for _, k := range []string{"1~" + strings.Repeat("A", 22), "POST /orders\x1f8f14e45f-ceea-467a"} {
		if n := testing.AllocsPerRun(100, func() { s.Locate(k) }); n != 2 {
			t.Errorf("%q: %v allocations, want 2", k, n)
		}
	}
}

// TestBucketTTLAskedOncePerLifecycle: a claim's save leaves the bucket's
// TTL long enough for its settle (a retention no longer than the claim's),
// and says so in the value (flag 8), so the settle does not ask the TTL
// again: one PEXPIRETIME a lifecycle, not two. A settle that needs more
// (a longer retention), or whose claim was saved without the flag, asks
// and extends. Every record ends inside its
// bucket's TTL. A server of its own: the counts are the server's.
func TestBucketTTLAskedOncePerLifecycle(t *testing.T) {
	srv := testenv.StartRedisServer(t)
	s := testenv.OpenRedisConfig(t, srv.Addr, redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":", Buckets: 1})
	ctx := context.Background()
	c := s.Client()
	pexpiretimes := func() int {
		calls, _ := commandStats(t, c)
		return calls["pexpiretime"]
	}
	lifecycle := func(key string, claim, settle time.Duration) {
		t.Helper()
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: key, Lease: time.Minute, Retention: claim})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, key, a.Fence, []byte("ok"), settle); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 100
	for i := range n {
		lifecycle(fmt.Sprintf("k-%d", i), time.Hour, time.Hour)
	}
	if got := pexpiretimes(); got != n {
		t.Errorf("%d lifecycles asked the bucket's TTL %d times, want %d (once each)", n, got, n)
	}

	// A settle with a longer retention than its claim's asks, and extends.
	before := pexpiretimes()
	lifecycle("longer", 2*time.Minute, 48*time.Hour)
	if got := pexpiretimes() - before; got != 2 {
		t.Errorf("a settle of 48 h after a claim of 2 min: %d asks, want 2", got)
	}

	// A claim saved without the flag (as where its save knew the TTL to
	// reach its expiry, not its retention twice over).
	a, err := s.Acquire(ctx, store.AcquireRequest{Key: "unflagged", Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	keys, field := s.Locate("unflagged")
	if err := c.Eval(ctx, `local v = redis.call('HGET', KEYS[1], ARGV[1])
local fl = string.byte(v, 1)
if fl % 16 < 8 then return redis.error_reply('the claim is not flagged') end
redis.call('HSET', KEYS[1], ARGV[1], string.char(fl - 8) .. string.sub(v, 2))
return 1`, []string{keys[1]}, field).Err(); err != nil {
		t.Fatal(err)
	}
	before = pexpiretimes()
	if err := s.Complete(ctx, "unflagged", a.Fence, []byte("ok"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := pexpiretimes() - before; got != 1 {
		t.Errorf("the settle of an unflagged claim asked the TTL %d times, want 1", got)
	}

	// Every record's expiry is inside its bucket's TTL.
	for _, k := range []string{"longer", "unflagged", "k-0", fmt.Sprintf("k-%d", n-1)} {
		rec, err := s.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		keys, _ := s.Locate(k)
		ttl, err := c.PExpireTime(ctx, keys[1]).Result()
		if err != nil {
			t.Fatal(err)
		}
		if end := time.UnixMilli(int64(ttl / time.Millisecond)); rec.ExpiresAt.After(end) {
			t.Errorf("%s expires at %v, after its bucket (%v)", k, rec.ExpiresAt, end)
		}
	}
}

// TestBucketAcquisitionCalls: a bucketed acquisition reads before it writes, as
// a key per record's does (TestAcquisitionCalls): a new key's is TIME, HGET,
// GET (the record's own key, where a record may still be), HSET and
// PEXPIRETIME (the bucket's TTL, which the claim's write may extend), plus the sweep's
// look at its time for one new field in eight (by fence); a duplicate's is
// TIME and HGET alone.
func TestBucketAcquisitionCalls(t *testing.T) {
	srv := testenv.StartRedisServer(t)
	prefix := testenv.RandomName("idemtest:") + ":"
	s := testenv.OpenRedisConfig(t, srv.Addr, redisstore.Config{Prefix: prefix, Buckets: 1})
	ctx := context.Background()
	c := s.Client()
	bucketOf := func(key string) string { keys, _ := s.Locate(key); return keys[1] }
	// Keys of one bucket, which exists, with its next sweep an hour away:
	// a sweep check is then one HGET of its time.
	if _, err := s.Acquire(ctx, store.AcquireRequest{Key: "first", Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	b := bucketOf("first")
	if err := c.Eval(ctx, `redis.call('HSET', KEYS[1], '', struct.pack('>I6', ARGV[1]))`, []string{b},
		time.Now().Add(time.Hour).UnixMilli()).Err(); err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	var keys []string
	for i := 0; len(keys) < 40; i++ {
		if k := fmt.Sprintf("k-%d", i); bucketOf(k) == b {
			keys = append(keys, k)
		}
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	checks := 0
	for _, k := range keys {
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: time.Hour})
		if err != nil || a.Outcome != store.Acquired {
			t.Fatalf("%s: %v %v", k, a.Outcome, err)
		}
		if a.Fence%8 == 0 {
			checks++
		}
	}
	if got, n := scriptCalls(t, c); n != 5*len(keys)+checks {
		t.Errorf("%d acquisitions of new keys (%d sweep checks): %d Redis calls, want %d: %v", len(keys), checks, n, 5*len(keys)+checks, got)
	}

	// A key with a record: read, answered, nothing written.
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	a, err := s.Acquire(ctx, store.AcquireRequest{Key: keys[0], Lease: time.Minute, Retention: time.Hour})
	if err != nil || a.Outcome != store.InProgress {
		t.Fatalf("a duplicate: %v %v", a.Outcome, err)
	}
	if got, n := scriptCalls(t, c); n != 2 || got["hget"] != 1 {
		t.Errorf("the acquisition of a key with a record: %d Redis calls, want 2 (TIME, HGET): %v", n, got)
	}
}

// TestRecordInItsOwnKeyBesideItsBucket: a key whose record is still in its own
// key (written before buckets were on) while its bucket exists — so
// nothing in the bucket says the record is elsewhere: the acquisition
// finds the record in its own key and answers it (replayed, in flight,
// taken over once its lease ran out), and writes no claim into the bucket
// beside it.
func TestRecordInItsOwnKeyBesideItsBucket(t *testing.T) {
	prefix := testenv.RandomName("idemtest:") + ":"
	before := testenv.OpenRedis(t, prefix)
	after := openBuckets(t, prefix)
	ctx := context.Background()
	bucketOf := func(key string) string { keys, _ := after.Locate(key); return keys[1] }
	req := func(k string, lease time.Duration) store.AcquireRequest {
		return store.AcquireRequest{Key: k, Lease: lease, Retention: time.Hour}
	}
	fences := claimAll(t, before, req, "done", "running", "lease-over")
	for k := range fences {
		for i := 0; ; i++ { // a neighbour's claim makes the bucket
			if n := fmt.Sprintf("%s-neighbour-%d", k, i); bucketOf(n) == bucketOf(k) {
				if _, err := after.Acquire(ctx, req(n, time.Minute)); err != nil {
					t.Fatal(err)
				}
				break
			}
		}
	}
	if err := before.Complete(ctx, "done", fences["done"], []byte("result"), time.Hour); err != nil {
		t.Fatal(err)
	}
	c := after.Client()
	inBucket := func(k string) bool {
		keys, field := after.Locate(k)
		in, err := c.HExists(ctx, keys[1], field).Result()
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	if a, err := after.Acquire(ctx, req("done", time.Minute)); err != nil || a.Outcome != store.Replayed || string(a.Record.Result) != "result" {
		t.Fatalf("done: %v %+v %v", a.Outcome, a.Record, err)
	}
	if a, err := after.Acquire(ctx, req("running", time.Minute)); err != nil || a.Outcome != store.InProgress {
		t.Fatalf("running: %v %v", a.Outcome, err)
	}
	for _, k := range []string{"done", "running"} {
		if inBucket(k) {
			t.Errorf("%s: a field in its bucket beside its own key's record", k)
		}
	}
	takeOver(t, after, req("lease-over", time.Minute), fences["lease-over"])
	if !inBucket("lease-over") {
		t.Error("lease-over: its takeover did not move it into its bucket")
	}
}

// TestBucketValueFitsTheDefaultListpack: a completed record with a compact
// key, a digest fingerprint and a 28-byte result (the record
// Config.Buckets is sized for) keeps its bucket a listpack under the
// server's default hash-max-listpack-value (64): a longer value turns the
// whole bucket into a hash table, some 60 bytes more per record.
func TestBucketValueFitsTheDefaultListpack(t *testing.T) {
	srv := testenv.StartRedisServer(t)
	s := testenv.OpenRedisConfig(t, srv.Addr, redisstore.Config{Prefix: testenv.RandomName("idemtest:") + ":", Buckets: 1})
	ctx := context.Background()
	c := s.Client()
	if v, err := c.ConfigGet(ctx, "hash-max-listpack-value").Result(); err != nil || v["hash-max-listpack-value"] != "64" {
		t.Fatalf("hash-max-listpack-value: %v %v, want the default 64", v, err)
	}
	key := store.CompactKey("POST /bookings", "0f8fad5b-d9cb-469f-a165-70867728950e")
	result := []byte(`{"status":201,"id":"B-0001"}`)
	keys, field := s.Locate(key)
	check := func(when string) {
		t.Helper()
		n, err := c.HStrLen(ctx, keys[1], field).Result()
		if err != nil || n == 0 {
			t.Fatalf("%s: the record is not in its bucket (%d, %v)", when, n, err)
		}
		enc, err := c.ObjectEncoding(ctx, keys[1]).Result()
		if err != nil || enc != "listpack" {
			t.Fatalf("%s: a %d-byte value, its bucket encoded as %q (%v), want listpack", when, n, enc, err)
		}
	}
	for i := range 3 { // three generations: a claim, its completion and its replay each time
		a, err := s.Acquire(ctx, store.AcquireRequest{Key: key, Fingerprint: idem.Fingerprint(result), Lease: time.Minute, Retention: time.Hour})
		if err != nil || a.Outcome != store.Acquired {
			t.Fatalf("generation %d: %v %v", i, a.Outcome, err)
		}
		check("in flight")
		if err := s.Complete(ctx, key, a.Fence, result, time.Hour); err != nil {
			t.Fatal(err)
		}
		check("completed")
		r, err := s.Acquire(ctx, store.AcquireRequest{Key: key, Fingerprint: idem.Fingerprint(result), Lease: time.Minute, Retention: time.Hour})
		if err != nil || r.Outcome != store.Replayed || string(r.Record.Result) != string(result) || r.Record.Fence != a.Fence {
			t.Fatalf("replay: %v %+v %v", r.Outcome, r.Record, err)
		}
		if err := s.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
}
