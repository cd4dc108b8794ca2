package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

// The Guard campaign's lease: long enough that a cancelled work returns well
// within the Guard's margin (a tenth of it) on a loaded machine, short
// enough that kills and outages lead to takeovers within a campaign.
const guardCampaignLease = 3 * time.Second

// guardRideOut is the longest outage every run rides out, settle and all
// (see idem.Guard.Run): when the store goes away, a run's lease may have as
// little left as the lease less the Guard's margin (a tenth) and one
// heartbeat interval (the heartbeat due then fails), and the settle's next
// try may come up to a heartbeat interval after the store is back (its
// backoff), and take a round trip (100 ms allowed, on a loaded machine). A
// crash of the server keeps it away for as long as the server takes to
// recover — on a loaded machine, longer than this.
const guardRideOut = guardCampaignLease - guardCampaignLease/10 - 2*(guardCampaignLease/4) - 100*time.Millisecond

// GuardCampaign runs guarded work — idem.Guard.Run, as users do — from
// goroutines of this process and of cfg.Processes worker processes, on a
// moving window of keys each wanted by every worker at once (and now and
// then an older key again), while faults are injected at random as in
// Campaign — SIGKILL of worker processes, outages and stalls of the store's
// server shorter than a lease — and besides: outages longer than a lease,
// periods of a full server (cfg.Fill) longer than a lease, and sweeps. With cfg.Direct, half of this process's workers reach the
// store without the proxy: an outage is then a partition, in which they
// take over the keys of the workers cut off. The work takes up to two
// heartbeat intervals (now and then two to three leases, kept by its
// heartbeats), and now and then fails for good (Permanent: the failure is
// replayed) or for now (the claim is released and the key runs again).
// Every run is logged with its
// interval and whether its settle reached the store; at the end the
// campaign checks that
//
//   - no two runs of a key overlapped in time (a run ends when its work
//     returned, or when its process was killed): the Guard stops work whose
//     lease it cannot renew before another process may take the key over —
//     also across the long outages;
//   - no key ran again after a run of it succeeded or failed for good and
//     its settle reached the store; and every such run's settle reached
//     the store unless an outage longer than a lease, or a crash of the
//     server that kept it away for longer than guardRideOut, began before
//     its Run returned, within a lease after the run's end or later while
//     the Guard kept the claim with heartbeats, or its process was killed
//     meanwhile (the Guard tries a settle again within the lease, so the
//     short outages, stalls and quick crashes never cost one; a full server
//     must take it whatever the length);
//   - every replay is the result (or failure) of a run of that key that
//     succeeded (or failed for good);
//   - nothing was lost: after the faults, every key answers such a result,
//     or runs now if no run of it got that far.
//
// Deletes are not injected: deleting a key on purpose forgets it, and the
// next delivery runs it while the first run's work learns of it at its
// next heartbeat.
func GuardCampaign(t *testing.T, cfg CampaignConfig) {
	if p := os.Getenv(envCampaignProc); p != "" {
		proc, _ := strconv.Atoi(p)
		deadline, _ := strconv.ParseInt(os.Getenv(envCampaignDeadline), 10, 64)
		seed, _ := strconv.ParseUint(os.Getenv(envCampaignSeed), 10, 64)
		s := cfg.Open(t, os.Getenv(envLocation))
		fmt.Println(readyLine)
		runGuardWorkers(t, s, 2, proc, os.Getenv(envCampaignDir), time.Unix(0, deadline), seed)
		return
	}
	if cfg.Goroutines <= 0 {
		cfg.Goroutines = 4
	}
	seed := *campaignSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("guard campaign seed %d (replay: -campaign.seed=%d), duration %v", seed, seed, campaignDuration())
	dir := t.TempDir()
	s := cfg.Open(t, cfg.Location)
	deadline := time.Now().Add(campaignDuration())
	var rep CampaignReport
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		runGuardWorkers(t, s, cfg.Goroutines, 0, dir, deadline, seed)
	}()
	if cfg.Direct != "" { // the workers on the other side of the partitions
		direct := cfg.Open(t, cfg.Direct)
		wg.Add(1)
		go func() {
			defer wg.Done()
			runGuardWorkers(t, direct, cfg.Goroutines, -1, dir, deadline, seed)
		}()
	}
	procs := workerProcesses(t, cfg, "guardcampaign", dir, deadline, seed)
	for range cfg.Processes {
		procs.Spawn()
	}
	var long [][2]int64 // the outages longer than a lease, ns
	injectFaults(cfg, procs, seed, deadline, &rep, func(frng *rand.Rand, _ int) {
		if cfg.Cut != nil && frng.IntN(8) == 0 && time.Now().Add(2*guardCampaignLease).Before(deadline) {
			cut := time.Now().UnixNano()
			cfg.Cut()
			time.Sleep(guardCampaignLease + time.Duration(frng.IntN(1000))*time.Millisecond)
			cfg.Restore()
			long = append(long, [2]int64{cut, time.Now().UnixNano()})
			return
		}
		if cfg.Fill != nil && frng.IntN(8) == 0 && time.Now().Add(2*guardCampaignLease).Before(deadline) {
			// A server full for longer than a lease: no new work starts,
			// and the work running must still settle (not excused).
			cfg.Fill()
			time.Sleep(guardCampaignLease + time.Duration(frng.IntN(1000))*time.Millisecond)
			cfg.Unfill()
			rep.Fills++
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = s.Sweep(ctx, 0)
		cancel()
		rep.Sweeps++
	})
	wg.Wait()
	procs.Wait()
	killedAt := procs.KilledMillis()
	runs := readRuns(t, dir, killedAt)
	checkGuardRuns(t, s, runs, seed, killedAt, unriddenOutages(long, rep.CrashOutages))
	did := map[string]int{}
	for _, r := range runs {
		did[r.did]++
		if (r.did == runSucceeded || r.did == runFailed) && !r.settled {
			did[r.did+" unsettled"]++
		}
	}
	var longestCrash time.Duration
	for _, o := range rep.CrashOutages {
		longestCrash = max(longestCrash, time.Duration(o[1]-o[0]))
	}
	t.Logf("guard campaign: %d keys; runs that %v; %d kills, %d outages (%d longer than a lease), %d stalls, %d full-server periods, %d server crashes (the longest down %v), %d moves, %d sweeps",
		len(keysOf(runs)), did, rep.Kills, rep.Outages+len(long), len(long), rep.ServerStalls, rep.Fills, rep.Crashes, longestCrash.Round(time.Millisecond), rep.Moves, rep.Sweeps)
}

// unriddenOutages are the outages a run's settle may be lost to (see
// GuardCampaign): the cuts longer than a lease, and the crashes of the
// server that kept it away for longer than guardRideOut — both as from
// and to, ns.
func unriddenOutages(longCuts, crashes [][2]int64) [][2]int64 {
	out := slices.Clone(longCuts)
	for _, c := range crashes {
		if time.Duration(c[1]-c[0]) > guardRideOut {
			out = append(out, c)
		}
	}
	return out
}

// settleExcused tells whether the run r, unsettled, may have lost its
// settle to a fault: its process was killed, or one of outages (from and
// to, ns) came near it — before its Run returned, or within a lease after
// its work ended (the settle is tried until the lease ends, and past it
// while the store takes the heartbeats between its tries).
func settleExcused(r guardRun, killedAt map[int]int64, outages [][2]int64) bool {
	until := max(r.end+int64(guardCampaignLease), r.settleEnd)
	if k := killedAt[r.proc] * int64(time.Millisecond); k >= r.end && (r.settleEnd == 0 || k < until) {
		return true
	}
	for _, o := range outages {
		if o[0] < until && o[1] > r.end {
			return true
		}
	}
	return false
}

// guardKey is the i-th key of a campaign: the window of keys moves on every
// 250 ms, and a worker picks one of its four at random, or (one time in
// four) one of the 40 before.
func guardKey(seed uint64, i int64) idem.Key {
	return idem.Key{Scope: "guard-campaign-" + strconv.FormatUint(seed, 36), ID: strconv.FormatInt(i, 10)}
}

const (
	guardWindowStep = 250 * time.Millisecond
	guardWindow     = 4
	guardOlder      = 40
)

// What a run's work did, as its log line says.
const (
	runSucceeded = "ok"
	runFailed    = "failed" // for good: idem.Permanent
	runReleased  = "released"
	runCancelled = "cancelled"
	runKilled    = "killed"
)

// runGuardWorkers runs n goroutines of guarded work until deadline, logging
// to runs-<proc>.log in dir a line when a work starts ("S"), one when it
// returns ("E", with what it did), one when its run ended ("T", with
// whether its settle reached the store) and one for each replay ("R", with
// the record's fence and the result or failure it replayed: each names the
// fence of the run that left it).
func runGuardWorkers(t *testing.T, s store.Store, n, proc int, dir string, deadline time.Time, seed uint64) {
	f, err := os.OpenFile(filepath.Join(dir, "runs-"+strconv.Itoa(proc)+".log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	logLine := func(kind string, key idem.Key, fence uint64, rest string) {
		// One write per line: whole lines survive a SIGKILL.
		_, _ = f.WriteString(fmt.Sprintf("%s %s %d %d %s\n", kind, key.ID, fence, time.Now().UnixNano(), rest))
	}
	epoch := deadline.Add(-campaignDuration())
	var settles sync.Map // "key fence" → *settleTrail
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: guardCampaignLease, HeartbeatInterval: guardCampaignLease / 4,
		Observer: func(e idem.Event) {
			if e.Phase == "settle" || e.Phase == "heartbeat" && e.Err != nil {
				v, _ := settles.LoadOrStore(e.Key+" "+strconv.FormatUint(e.Fence, 10), &settleTrail{})
				v.(*settleTrail).add(e, time.Since(epoch))
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(proc*100+w+1)))
			var redeliver idem.Key // a key answered InProgress, asked again as a broker redelivers
			var redeliverUntil time.Time
			for time.Now().Before(deadline) {
				i := int64(time.Since(epoch)/guardWindowStep) + rng.Int64N(guardWindow)
				if rng.IntN(4) == 0 {
					i = max(0, i-guardWindow-rng.Int64N(guardOlder))
				}
				key := guardKey(seed, i)
				if redeliver.ID != "" && time.Now().Before(redeliverUntil) {
					key = redeliver
				}
				// ms: up to 50; one time in five up to two heartbeat
				// intervals; one in twenty two to three leases.
				work := rng.IntN(50)
				switch long := int(guardCampaignLease / time.Millisecond); rng.IntN(20) {
				case 0:
					work = 2*long + rng.IntN(long)
				case 1, 2, 3, 4:
					work = rng.IntN(long / 2)
				}
				fate := rng.IntN(20)
				ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(guardCampaignLease))
				res, err := g.Run(ctx, key, nil, func(ctx context.Context, fence uint64) ([]byte, error) {
					logLine("S", key, fence, "")
					select {
					case <-ctx.Done():
						logLine("E", key, fence, runCancelled)
						return nil, ctx.Err()
					case <-time.After(time.Duration(work) * time.Millisecond):
					}
					switch {
					case fate == 0:
						logLine("E", key, fence, runFailed)
						return nil, idem.Permanent(errors.New(failureOf(fence)))
					case fate < 3:
						logLine("E", key, fence, runReleased)
						return nil, errors.New("try again")
					}
					logLine("E", key, fence, runSucceeded)
					return []byte(resultOf(fence)), nil
				})
				cancel()
				switch {
				case res.Outcome.Owns():
					v, _ := settles.LoadAndDelete(g.StorageKey(key) + " " + strconv.FormatUint(res.Fence, 10))
					tr, _ := v.(*settleTrail)
					switch {
					case tr != nil && tr.tried && tr.last == nil:
						logLine("T", key, res.Fence, "settled")
					case tr != nil && tr.tried:
						logLine("T", key, res.Fence, "unsettled "+strings.ReplaceAll(tr.last.Error()+" (tries: "+strings.Join(tr.events, "; ")+")", "\n", " "))
					default:
						logLine("T", key, res.Fence, "unsettled (no settle was tried)")
					}
				case err == nil && res.Outcome == store.Replayed:
					logLine("R", key, res.Record.Fence, string(res.Value))
				case err == nil && res.Outcome == store.InProgress:
					if key != redeliver {
						redeliver, redeliverUntil = key, time.Now().Add(3*guardCampaignLease)
					}
					time.Sleep(time.Duration(20+rng.IntN(30)) * time.Millisecond) // a broker's redelivery delay
					continue
				}
				redeliver = idem.Key{}
			}
		}()
	}
	wg.Wait()
}

// resultOf and failureOf are what the run under fence leaves when it
// succeeds or fails for good.
func resultOf(fence uint64) string  { return "v" + strconv.FormatUint(fence, 10) }
func failureOf(fence uint64) string { return "refused-" + strconv.FormatUint(fence, 10) }

// settleTrail is what a run's settle met: its tries and the heartbeats
// that failed (the last 16, each with its time in the campaign), and the
// last try's error.
type settleTrail struct {
	mu     sync.Mutex
	tried  bool
	last   error
	events []string
}

func (tr *settleTrail) add(e idem.Event, at time.Duration) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if e.Phase == "settle" {
		tr.tried, tr.last = true, e.Err
	}
	what := "ok"
	if e.Err != nil {
		what = e.Err.Error()
		if len(what) > 120 {
			what = what[:120] + "…"
		}
	}
	tr.events = append(tr.events, fmt.Sprintf("%s at %v (%v): %s", e.Phase, at.Round(time.Millisecond), e.Duration.Round(time.Millisecond), what))
	if len(tr.events) > 16 {
		tr.events = tr.events[1:]
	}
}

// guardRun is one run of a key's work, from its start to its end (the work
// returned, or its process was killed), or a replay (did "R", at start).
type guardRun struct {
	key        string
	fence      uint64
	proc       int
	start, end int64 // ns
	did        string
	settled    bool   // its settle reached the store
	settleErr  string // why not, when it did not
	settleEnd  int64  // ns: when Run returned (0: its process was killed first)
	replayed   string // a replay's result or failure
}

func readRuns(t *testing.T, dir string, killedAt map[int]int64) []guardRun {
	files, _ := filepath.Glob(filepath.Join(dir, "runs-*.log"))
	var runs []guardRun
	for _, path := range files {
		proc, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "runs-"), ".log"))
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		open := map[string]int{} // "key fence" → index in runs
		for _, line := range strings.Split(string(data), "\n") {
			fields := strings.Fields(line)
			if len(fields) < 4 {
				continue
			}
			fence, _ := strconv.ParseUint(fields[2], 10, 64)
			at, _ := strconv.ParseInt(fields[3], 10, 64)
			id := fields[1] + " " + fields[2]
			rest := ""
			if len(fields) > 4 {
				rest = fields[4]
			}
			switch i, ok := open[id]; fields[0] {
			case "S":
				open[id] = len(runs)
				runs = append(runs, guardRun{key: fields[1], fence: fence, proc: proc, start: at, end: -1})
			case "E":
				if ok {
					runs[i].end, runs[i].did = at, rest
				}
			case "T":
				if ok {
					runs[i].settled = rest == "settled"
					runs[i].settleEnd = at
					runs[i].settleErr = strings.Join(fields[min(5, len(fields)):], " ")
					delete(open, id)
				}
			case "R":
				runs = append(runs, guardRun{key: fields[1], fence: fence, proc: proc, start: at, end: at, did: "R", replayed: rest})
			}
		}
		for _, i := range open {
			if runs[i].end < 0 { // the work was running when its process was killed
				runs[i].did = runKilled
				runs[i].end = killedAt[proc] * int64(time.Millisecond) // the process was gone by then
			}
			if killedAt[proc] == 0 {
				t.Errorf("process %d: the run of key %s (fence %d) never ended, and the process was not killed", proc, runs[i].key, runs[i].fence)
			}
		}
	}
	return runs
}

func keysOf(runs []guardRun) map[string][]guardRun {
	byKey := map[string][]guardRun{}
	for _, r := range runs {
		byKey[r.key] = append(byKey[r.key], r)
	}
	return byKey
}

// checkGuardRuns checks the runs of every key (see GuardCampaign), excusing
// the settles lost to outages, then asks each key once more.
func checkGuardRuns(t *testing.T, s store.Store, runs []guardRun, seed uint64, killedAt map[int]int64, outages [][2]int64) {
	g, err := idem.NewGuard(idem.Config{Store: s, Lease: guardCampaignLease})
	if err != nil {
		t.Fatal(err)
	}
	violations := 0
	violate := func(format string, a ...any) {
		if violations++; violations <= 20 {
			t.Errorf(format, a...)
		}
	}
	for key, kr := range keysOf(runs) {
		var replays []guardRun
		kr = slices.DeleteFunc(kr, func(r guardRun) bool {
			if r.did == "R" {
				replays = append(replays, r)
			}
			return r.did == "R"
		})
		sort.Slice(kr, func(i, j int) bool { return kr[i].start < kr[j].start })
		final := map[string]bool{} // what the runs that got that far left to replay
		var settled *guardRun
		for i := range kr {
			r := &kr[i]
			if i > 0 && r.start < kr[i-1].end {
				violate("key %s: the run of fence %d (process %d) started %v before the run of fence %d (process %d) ended (%s)",
					key, r.fence, r.proc, time.Duration(kr[i-1].end-r.start), kr[i-1].fence, kr[i-1].proc, kr[i-1].did)
			}
			if settled != nil {
				violate("key %s: ran again under fence %d (process %d) after its run under fence %d %s and was settled",
					key, r.fence, r.proc, settled.fence, settled.did)
			}
			switch r.did {
			case runSucceeded:
				final[resultOf(r.fence)] = true
			case runFailed:
				final[failureOf(r.fence)] = true
			default:
				continue
			}
			if r.settled && settled == nil {
				settled = r
			}
			if !r.settled && !settleExcused(*r, killedAt, outages) {
				violate("key %s: the settle of its run under fence %d (%s, process %d) did not reach the store, though no outage the Guard cannot ride out came near it: %s",
					key, r.fence, r.did, r.proc, r.settleErr)
			}
		}
		// The fence a replay's record carries is not checked: the tiered
		// store answers a replay from the hot tier's copy, under the fence
		// of the claim that re-warmed it; the value names the run's fence.
		for _, r := range replays {
			if !final[r.replayed] {
				violate("key %s: replayed %q (record fence %d), which no run of it left behind (%v)", key, r.replayed, r.fence, final)
			}
		}
		// A key held by a run that was cancelled or killed is in progress
		// until its lease ends (on the store's clock: asked again until then).
		id, _ := strconv.ParseInt(key, 10, 64)
		ran := false
		var res idem.Result
		for asked := time.Now(); ; time.Sleep(100 * time.Millisecond) {
			res, err = g.Run(context.Background(), guardKey(seed, id), nil, func(ctx context.Context, fence uint64) ([]byte, error) {
				ran = true
				return []byte("after"), nil
			})
			if err != nil || res.Outcome != store.InProgress || time.Since(asked) > guardCampaignLease+5*time.Second {
				break
			}
		}
		switch value := string(res.Value); {
		case err != nil:
			violate("key %s: asked after the campaign: %v", key, err)
		case ran && settled != nil:
			violate("key %s: ran after the campaign although its run under fence %d %s and was settled", key, settled.fence, settled.did)
		case !ran && res.Outcome != store.Replayed:
			violate("key %s: after the campaign: %v, want a replay or a run", key, res.Outcome)
		case !ran && !final[value]:
			violate("key %s: after the campaign replays %q (record fence %d), which no run of it left behind (%v)", key, value, res.Record.Fence, final)
		}
	}
	if violations > 0 {
		t.Errorf("%d violations (seed %d)", violations, seed)
	}
}
