package brokertest

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/drain"
	"github.com/idemgo/idem/internal/fleet"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/storeurl"
)

var (
	campaignDurationFlag = flag.Duration("broker.campaign.duration", 8*time.Second, "how long the broker fault campaign publishes and injects faults")
	campaignSeed         = flag.Uint64("broker.campaign.seed", 0, "seed of the broker fault campaign (0: a new one, printed)")
	campaignMaxBacklog   = flag.Int("broker.campaign.max-backlog", 0, "the most keys published and not yet completed before the producer waits (0: the test's CampaignConfig.MaxBacklog)")
)

// Environment of a campaign's consumer process.
const (
	envCampaignProc  = "IDEM_BROKERTEST_CAMPAIGN_PROC"
	envCampaignTopic = "IDEM_BROKERTEST_CAMPAIGN_TOPIC"
	envCampaignDir   = "IDEM_BROKERTEST_CAMPAIGN_DIR"
	envCampaignStore = "IDEM_BROKERTEST_CAMPAIGN_STORE" // the consumer's store URL
	campaignReady    = "IDEM BROKERTEST CAMPAIGN CONSUMING"
	// campaignLease is the consumers' lease: a twentieth of the work
	// outlives it (and the broker's ack deadline) on heartbeats; a frozen
	// consumer loses it.
	campaignLease = 1500 * time.Millisecond
)

// Campaign runs the adapter under faults, as users run it: a producer
// publishes messages with keys — a third of them again later under a new
// broker id (the producer's retry), one in twenty again with another body
// (a reused key) — to consumers in this process and in three processes of
// their own, which run the work through idem.Guard over one SQLite file
// and the adapter under test, while the consumer processes are killed
// (SIGKILL, and replaced) and frozen (SIGSTOP, past the lease and the
// broker's ack deadline) at random. The producer keeps at most
// CampaignConfig.MaxBacklog keys published and not yet completed. The work logs each run (its key, fence
// and body) to a file of its process, takes up to 3 s (longer than the
// lease: the Guard's heartbeats report progress to the broker) and fails
// now and then (released, redelivered). Then the faults stop, and every
// key must be completed in the store: the drain waits while keys complete,
// and fails when none has for CampaignConfig.Stall, or at a bound of three
// times the run (internal/drain), printing its progress every ten seconds.
// It checks:
//   - never lost: every key published was completed, by a run of its own;
//   - never twice: no run of a key started after the run whose result is
//     stored (a consumer frozen between its claim and its work excepted),
//     and every other run that succeeded lost its settle to a kill or a
//     freeze of its consumer, or to a freeze of any consumer (one frozen
//     while it holds the SQLite file's write lock stalls every settle);
//   - one owner at a time: two runs of a key overlapped only when the
//     first one's consumer was frozen or killed meanwhile, or frozen
//     between its claim and the run's start (a frozen process cannot stop
//     its work when its lease runs out);
//   - never someone else's: a key's runs carry bodies published under it,
//     and the stored run's body is the one the record's fingerprint names.
//
// With CampaignConfig.Postgres the store is PostgreSQL instead, reached by
// the test's consumer and the odd processes through a proxy that cuts it
// (now and then for longer than a lease) and stalls it, by the even ones
// directly — a partition: the adapters meet failed acquisitions (retried)
// and settles that do not land (redelivered once the lease ends), and a
// successful run whose settle was lost is also excused by an outage on its
// side.
//
// cfg.TestName is the calling test, which must call Campaign first: in a
// consumer process Campaign consumes until it is killed. Only for brokers
// with Features.CrossProcess.
func Campaign(t *testing.T, h Harness, cfg CampaignConfig) {
	if n := os.Getenv(envCampaignProc); n != "" {
		proc, _ := strconv.Atoi(n)
		consumeForCampaign(t, h, proc, os.Getenv(envCampaignTopic), os.Getenv(envCampaignDir), os.Getenv(envCampaignStore))
		select {} // killed at the campaign's end
	}
	seed := *campaignSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("broker campaign seed %d (replay: -broker.campaign.seed=%d), duration %v", seed, seed, campaignDuration())
	topic := h.NewTopic(t)
	dir := t.TempDir()
	proxied := "sqlite:" + filepath.Join(dir, "records.db")
	direct := proxied
	var proxy *testenv.Proxy
	if cfg.Postgres {
		schema := testenv.RandomName("idemtest_")
		conn, p := testenv.PostgresProxy(t)
		proxy = p
		proxied, direct = conn+"&idem_schema="+schema, testenv.PostgresURL+"&idem_schema="+schema
		t.Cleanup(func() {
			if c, err := pgx.Connect(context.Background(), testenv.PostgresURL); err == nil {
				_, _ = c.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
				c.Close(context.Background())
			}
		})
	}
	stop := consumeForCampaign(t, h, 0, topic, dir, proxied)
	procs := fleet.New(t, cfg.TestName, campaignReady, []string{"-broker.campaign.duration=" + campaignDuration().String()}, func(n int) []string {
		st := direct
		if n%2 == 1 {
			st = proxied
		}
		return []string{envCampaignProc + "=" + strconv.Itoa(n), envCampaignTopic + "=" + topic, envCampaignDir + "=" + dir, envCampaignStore + "=" + st}
	})
	for range 3 {
		procs.Spawn()
	}

	// The producer.
	rng := rand.New(rand.NewPCG(seed, 1))
	bodies := map[string][]string{} // key → the bodies published under it
	var order []string
	var again []string // keys to publish again
	publish := func(key, body string) {
		h.Publish(t, topic, key, []byte(body))
		if !containsString(bodies[key], body) {
			bodies[key] = append(bodies[key], body)
		}
	}
	deadline := time.Now().Add(campaignDuration())
	frng := rand.New(rand.NewPCG(seed, 2))
	kills, freezes, cuts, stalls := 0, 0, 0, 0
	nextFault := time.Now()
	var outages *testenv.Outages
	if proxy != nil {
		outages = testenv.NewOutages(proxy)
	}
	injectFault := func() {
		if time.Now().After(nextFault) {
			switch f := frng.IntN(6); {
			case f < 2:
				procs.KillOne(frng)
				kills++
			case f < 4:
				procs.FreezeOne(frng, time.Duration(300+frng.IntN(3000))*time.Millisecond)
				freezes++
			case outages == nil || outages.Busy():
			case f == 4:
				d := time.Duration(100+frng.IntN(400)) * time.Millisecond
				if frng.IntN(4) == 0 {
					d = campaignLease + 500*time.Millisecond
				}
				outages.Cut(d)
				cuts++
			default:
				outages.Stall(time.Duration(100+frng.IntN(2000)) * time.Millisecond)
				stalls++
			}
			nextFault = time.Now().Add(time.Duration(200+frng.IntN(600)) * time.Millisecond)
		}
	}
	// The producer keeps at most maxBacklog keys published and not yet
	// completed: a producer that outpaces the consumers by design measures
	// a backlog, not a guarantee. The faults go on while it waits.
	s, err := storeurl.Open(context.Background(), direct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	track := &tracker{s: s, g: newGuard(t, idem.Config{Store: s}), records: map[string]store.Record{}}
	maxBacklog := cfg.MaxBacklog
	if *campaignMaxBacklog > 0 {
		maxBacklog = *campaignMaxBacklog
	}
	if maxBacklog == 0 {
		maxBacklog = 300
	}
	var paced time.Duration // how long the producer waited for the consumers
	nextCount := time.Now()
	for time.Now().Before(deadline) {
		if time.Now().After(nextCount) {
			_, _ = track.refresh() // an outage of the store: counted again next time
			nextCount = time.Now().Add(250 * time.Millisecond)
		}
		if len(track.pending) >= maxBacklog {
			paced += 10 * time.Millisecond
			injectFault()
			time.Sleep(10 * time.Millisecond)
			continue
		}
		key := fmt.Sprintf("PAY-%d", len(order))
		order = append(order, key)
		track.pending = append(track.pending, key)
		publish(key, "credit "+strconv.Itoa(len(order)))
		if rng.IntN(3) == 0 {
			again = append(again, key)
		}
		if rng.IntN(20) == 0 {
			publish(key, "credit "+strconv.Itoa(len(order))+" again")
		}
		if len(again) > 0 && rng.IntN(2) == 0 {
			k := again[0]
			again = again[1:]
			publish(k, bodies[k][0])
		}
		injectFault()
		time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond)
	}
	if outages != nil {
		outages.Wait()
	}
	procs.ThawAll()
	_, _ = track.refresh()
	t.Logf("%d keys published, %d kills, %d freezes, %d cuts, %d stalls; the producer waited %v for the consumers (at most %d keys behind), %d keys behind when the faults ended",
		len(order), kills, freezes, cuts, stalls, paced.Round(time.Second), maxBacklog, len(track.pending))

	// The faults are over: every key must be completed, the consumers
	// given as long as they make progress.
	res := drain.Wait(drain.Config{Stall: cfg.stall(), Bound: drainBound(), Logf: t.Logf}, track.refresh)
	if !res.Drained {
		t.Errorf("VIOLATION: %d keys not completed: %s; the drain's curve (done/to do every 10s): %s", len(track.pending), res.Why, res.CurveString(10*time.Second))
		for i, key := range track.pending {
			if i == 20 {
				t.Errorf("… and %d keys more", len(track.pending)-20)
				break
			}
			r, err := s.Get(context.Background(), track.g.StorageKey(idem.Key{Scope: Scope, ID: key}))
			t.Errorf("VIOLATION: key %s not completed: %+v, %v", key, r, err)
		}
		// Keys stuck: show where their messages are, as the broker sees
		// them, and where every consumer was, the test's own included
		// (its goroutines' stacks go to stderr).
		if h.Diagnose != nil {
			t.Logf("the broker's view of %s:\n%s", topic, h.Diagnose(t, topic))
		}
		t.Log("keys not completed: the consumers' goroutines follow on stderr")
		procs.DumpAll()
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
	}
	records := track.records
	procs.StopAll()
	stop()
	runs, decisions := readRuns(t, dir)
	// Consumers on the proxied side (the test's and the odd ones) lose
	// their settles in an outage.
	cutOff := func(proc int, from, to int64) bool {
		return outages != nil && (proc == 0 || proc%2 == 1) && len(outages.During(from, to)) > 0
	}
	checkCampaign(t, procs, runs, decisions, bodies, records, cutOff)
	if t.Failed() {
		t.Logf("replay: go test -run '^%s$' -broker.campaign.seed=%d -broker.campaign.duration=%v", cfg.TestName, seed, campaignDuration())
	}
}

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// consumeForCampaign consumes topic as consumer proc, logging its runs to
// a file of its own in dir, and prints campaignReady.
func consumeForCampaign(t *testing.T, h Harness, proc int, topic, dir, st string) (stop func()) {
	// A consumer started while the store is cut off opens it again, as a
	// supervisor would restart it.
	var s store.Store
	var err error
	for tries := 0; ; tries++ {
		if s, err = storeurl.Open(context.Background(), st, nil); err == nil || tries == 300 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	g := newGuard(t, idem.Config{Store: s, Lease: campaignLease})
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("runs-%d.log", proc)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(proc)))
	logRun := func(kind, key string, fence uint64, what string) {
		mu.Lock()
		defer mu.Unlock()
		// One write per line: a kill loses whole lines only.
		_, _ = fmt.Fprintf(f, "%s %d %s %d %d %s\n", kind, proc, key, fence, time.Now().UnixNano(), strconv.Quote(what))
	}
	events := make(chan Event, 1024)
	go func() {
		for e := range events { // what the adapter told the broker, and why
			logRun("D", e.Key, 0, e.Verdict.String()+": "+e.Reason)
		}
	}()
	policy := fast
	policy.InProgressDelay = 200 * time.Millisecond
	stop = h.Consume(t, topic, g, policy, func(ctx context.Context, key string, body []byte) error {
		fence, _ := idem.FenceFrom(ctx)
		logRun("S", key, fence, string(body))
		mu.Lock()
		d := time.Duration(rng.IntN(200)) * time.Millisecond
		if rng.IntN(20) == 0 {
			d = time.Duration(1500+rng.IntN(1500)) * time.Millisecond
		}
		fail := rng.IntN(10) == 0
		mu.Unlock()
		select {
		case <-time.After(d):
		case <-ctx.Done():
			logRun("E", key, fence, "cancelled")
			return ctx.Err()
		}
		if fail {
			logRun("E", key, fence, "failed")
			return errors.New("brokertest: a transient failure")
		}
		logRun("E", key, fence, "ok")
		return nil
	}, events)
	if proc != 0 {
		fmt.Println(campaignReady)
	}
	return stop
}

// CampaignConfig says how to run Campaign.
type CampaignConfig struct {
	// TestName is the calling test's name.
	TestName string
	// Postgres: the store is PostgreSQL, with outages (see Campaign);
	// otherwise one SQLite file.
	Postgres bool
	// MaxBacklog is the most keys published and not yet completed: the
	// producer waits for the consumers past it. Defaults to 300.
	MaxBacklog int
	// Stall is how long the drain after the faults waits without a key
	// completed before it fails: longer than the broker may rightly stop
	// delivering (a consumer group's rebalances). Defaults to a minute.
	Stall time.Duration
}

func (c CampaignConfig) stall() time.Duration {
	if c.Stall > 0 {
		return c.Stall
	}
	return time.Minute
}

// drainBound is the longest the drain waits, however the keys move.
func drainBound() time.Duration { return drain.Bound(campaignDuration()) }

// tracker follows which published keys are completed in the store.
type tracker struct {
	s       store.Store
	g       *idem.Guard
	pending []string                // published, not known completed, in publishing order
	records map[string]store.Record // the completed keys' records
	done    int
}

// refresh asks the store about every pending key; on an error the keys not
// asked stay pending.
func (k *tracker) refresh() (drain.Progress, error) {
	kept := k.pending[:0]
	var err error
	for i, key := range k.pending {
		var r store.Record
		if err == nil {
			r, err = k.s.Get(context.Background(), k.g.StorageKey(idem.Key{Scope: Scope, ID: key}))
			if errors.Is(err, store.ErrNotFound) {
				err = nil
			} else if err == nil && r.State == store.StateCompleted {
				k.records[key] = r
				k.done++
				continue
			}
		}
		if err != nil {
			kept = append(kept, k.pending[i:]...)
			break
		}
		kept = append(kept, key)
	}
	clear(k.pending[len(kept):])
	k.pending = kept
	return drain.Progress{Done: k.done, Left: len(k.pending)}, err
}

// run is one run of the work, from the consumers' logs.
type run struct {
	proc       int
	key        string
	fence      uint64
	start, end int64 // unix ns; end 0: none logged (killed)
	body, how  string
}

// decision is what a consumer's adapter decided for a delivery of a key.
type decision struct {
	proc int
	at   int64
	what string
}

func readRuns(t *testing.T, dir string) (map[string][]*run, map[string][]decision) {
	files, _ := filepath.Glob(filepath.Join(dir, "runs-*.log"))
	open := map[[2]string]*run{}
	runs := map[string][]*run{}
	decisions := map[string][]decision{}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var kind, key, what string
			var proc int
			var fence uint64
			var at int64
			if _, err := fmt.Sscanf(sc.Text(), "%s %d %s %d %d %q", &kind, &proc, &key, &fence, &at, &what); err != nil {
				continue // a line cut by a kill
			}
			id := [2]string{key, strconv.FormatUint(fence, 10)}
			if kind == "D" {
				decisions[key] = append(decisions[key], decision{proc, at, what})
				continue
			}
			if kind == "S" {
				r := &run{proc: proc, key: key, fence: fence, start: at, body: what}
				open[id] = r
				runs[key] = append(runs[key], r)
			} else if r := open[id]; r != nil {
				r.end, r.how = at, what
			}
		}
		f.Close()
	}
	return runs, decisions
}

func checkCampaign(t *testing.T, procs *fleet.Fleet, runs map[string][]*run, decisions map[string][]decision, bodies map[string][]string, records map[string]store.Record,
	cutOff func(proc int, from, to int64) bool) {
	violations := 0
	fail := func(format string, args ...any) {
		violations++
		if violations <= 20 {
			t.Errorf("VIOLATION: "+format, args...)
		}
	}
	total := 0
	for key, rs := range runs {
		total += len(rs)
		for _, r := range rs {
			if !containsString(bodies[key], r.body) {
				fail("key %s ran with body %q, which was never published under it", key, r.body)
			}
		}
		for i, a := range rs {
			for _, b := range rs[i+1:] {
				first, second := a, b
				if b.start < a.start {
					first, second = b, a
				}
				if first.end == 0 || second.start < first.end {
					// (A consumer frozen between its claim and its work's
					// start runs it when thawed, its lease gone.)
					if !procs.LostDuring(first.proc, first.start, second.start) && !procs.FrozenDuring(first.proc, first.start-int64(10*time.Second), first.start) {
						fail("key %s: runs under fences %d (consumer %d) and %d (consumer %d) overlapped, neither consumer killed nor frozen",
							key, first.fence, first.proc, second.fence, second.proc)
					}
				}
			}
		}
		rec, ok := records[key]
		if !ok {
			continue // reported as not completed
		}
		var stored *run
		for _, r := range rs {
			if r.fence == rec.Fence {
				stored = r
			}
		}
		if stored == nil || stored.how != "ok" {
			fail("key %s is completed under fence %d, which no successful run had (%v)", key, rec.Fence, stored)
			continue
		}
		if idem.Fingerprint([]byte(stored.body)) != rec.Fingerprint {
			fail("key %s: the stored run's body %q is not the one its record's fingerprint names", key, stored.body)
		}
		for _, r := range rs {
			switch {
			case r == stored:
			case r.start > stored.start:
				if !procs.FrozenDuring(r.proc, r.start-int64(10*time.Second), r.start) {
					fail("key %s: a run under fence %d (consumer %d) started %v after the stored run under fence %d (consumer %d)",
						key, r.fence, r.proc, time.Duration(r.start-stored.start), stored.fence, stored.proc)
				}
			case r.how == "ok" && !procs.LostDuring(r.proc, r.start, stored.start) && !procs.AnyFrozenDuring(r.start, stored.start) && !cutOff(r.proc, r.start, stored.start):
				// (A consumer frozen while it holds the SQLite file's write
				// lock is an outage for every consumer: settles wait.)
				var said []string // its consumer's decisions for the key after it: the settle's error
				for _, d := range decisions[key] {
					if d.proc == r.proc && d.at >= r.end {
						said = append(said, d.what)
					}
				}
				fail("key %s: the run under fence %d (consumer %d) succeeded and was not stored, no consumer killed or frozen before the stored run (fence %d, consumer %d) ran it again; its consumer then decided %q",
					key, r.fence, r.proc, stored.fence, stored.proc, said)
			}
		}
	}
	for key := range bodies {
		if len(runs[key]) == 0 && records[key].State == store.StateCompleted {
			fail("key %s is completed but never ran", key)
		}
	}
	t.Logf("%d runs of %d keys checked", total, len(runs))
	if violations > 20 {
		t.Errorf("… %d violations in all", violations)
	}
}

// campaignDuration is how long the campaign runs: -broker.campaign.duration, or under -short at
// most fleet.ShortDuration.
func campaignDuration() time.Duration {
	return fleet.Duration("broker.campaign.duration", *campaignDurationFlag)
}
