package storetest

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemgo/idem/internal/fleet"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/sqlitestore" // the ledger
)

var (
	campaignDurationFlag = flag.Duration("campaign.duration", 8*time.Second, "how long each backend's fault campaign runs")
	campaignSeed         = flag.Uint64("campaign.seed", 0, "seed of the fault campaign (0: a new one, printed)")
	campaignCheck        = flag.Duration("campaign.check", time.Minute, "how long the linearizability check of one key's history may take (then: unknown, reported)")
)

// Environment of a campaign worker process.
const (
	envCampaignProc     = "IDEM_CAMPAIGN_PROC"
	envCampaignDir      = "IDEM_CAMPAIGN_DIR"
	envCampaignDeadline = "IDEM_CAMPAIGN_DEADLINE"
	envCampaignSeed     = "IDEM_CAMPAIGN_SEED"
	readyLine           = "IDEM CAMPAIGN WORKER READY"
)

// CampaignConfig describes one backend's fault campaign.
type CampaignConfig struct {
	// TestName is the calling test; worker processes re-run it.
	TestName string
	// Location is where the store lives, shared by every process (a file, a
	// schema, a prefix); Open opens it.
	Location string
	Open     OpenAt
	// Processes is how many worker processes run beside the test's own
	// goroutines (0 for a store that lives in one process); one is killed
	// with SIGKILL and replaced now and then.
	Processes int
	// Cut and Restore take the store's server away and give it back (a
	// TCP proxy); nil where there is no server.
	Cut, Restore func()
	// Stall holds every byte to and from the store's server, and Unstall
	// lets them through (a latency spike: calls wait, leases run out);
	// nil where there is no server.
	Stall, Unstall func()
	// Fill makes the store's server run out of memory and Unfill gives it
	// room again (Redis over its maxmemory, noeviction): meanwhile new
	// claims fail closed, and the claims already held must still settle —
	// the Guard campaign excuses no settle lost to a full server. nil where
	// the server cannot be filled on demand (or is shared with other tests).
	Fill, Unfill func()
	// Crash kills the store's server with SIGKILL and starts it again on
	// its files, returning once it answers: it keeps what it acknowledged
	// (as its durability promises), and every call in flight at the kill
	// ends unknown. nil where the server is shared with other tests.
	Crash func()
	// Move moves the store's data from server to server while it serves
	// (a Redis Cluster's slots resharded from master to master): calls meet
	// records on their way and are redirected. nil where the data cannot
	// move.
	Move func()
	// Direct, when set, is Location reached without the proxy: the Guard
	// campaign runs half of its own workers there, so an outage is a
	// partition — the other processes lose the store while those go on.
	Direct string
	// Keys is the size of the hot key set. Defaults to 6.
	Keys int
	// Goroutines is how many workers run in the test's own process.
	// Defaults to 4.
	Goroutines int
	// InProgressAtExpiry accepts an InProgress or a Mismatch answer for a
	// settled record at the moment its retention ends. The tiered store
	// gives them when a duplicate meets the momentary hot claim of another
	// caller — one re-warming the hot tier, or one with another fingerprint
	// asking the cold tier — while the cold record expires (a window of one
	// cold round trip at the end of the retention). Nothing runs twice; a
	// retry gets the key as new.
	InProgressAtExpiry bool
	// TakeoverOfMomentaryClaims accepts TakenOver where Acquired would be
	// (no claim was handed out): a store that claims a key for a moment
	// while it asks elsewhere — the tiered store's hot claim while it reads
	// the cold tier — lets another caller take that claim over when the
	// asking outlasts the request's lease, and that caller is told
	// TakenOver although no work ran under the claim. The first caller
	// then fails closed; only one of them owns the key. Callers that come
	// while the momentary claim stands are told InProgress (or Mismatch,
	// for the other fingerprint), though the claim's own caller may end
	// up answered with a replay or Poisoned — the momentary claim may be
	// the takeover of a claim whose lease ended: accepted too, as answers
	// that run nothing.
	// An acquisition that fails with an error may also have given its
	// claim back (released, the attempt taken back). A momentary claim
	// taken over counts an attempt under which nothing ran, so an
	// acquisition with a MaxAttempts may poison a key the model holds
	// absent or released (the claim's give-back came after its lease: its
	// caller paused, or the hot tier stalled). And an acquisition at its
	// MaxAttempts takes the claim (past MaxAttempts, so as not to poison a
	// key settled elsewhere) before it poisons the key: one that fails with
	// an error may leave that claim, or the claim given back.
	TakeoverOfMomentaryClaims bool
	// SettleExtendsLease: a Complete or Fail extends the owner's lease by up
	// to this much before it takes effect (the tiered store does, so that no
	// takeover meets its cold archive): while it runs, duplicates may be told
	// InProgress (or Mismatch) past the original lease, and a settle that
	// fails may leave the extension behind.
	SettleExtendsLease time.Duration
}

// CampaignReport counts what a campaign did.
type CampaignReport struct {
	Seed                                           uint64
	Operations, Unknown                            int
	Kills, Outages, ServerStalls, Deletes, Sweeps  int
	Fills                                          int        // periods of a full server (Fill)
	Crashes                                        int        // kills of the server (Crash)
	CrashOutages                                   [][2]int64 // each crash's kill to the server answering again, ns
	Moves                                          int        // moves of the data (Move)
	Stalls                                         int        // owners of this process that slept past their lease
	Executions, LedgerAccepted                     int
	HistoriesChecked, HistoriesUnknown, Violations int
	Segments                                       int // checked separately, cut at isolated deletes
	PoisonedAnswers, Unclaims                      int // acquisitions answered Poisoned; Unclaim and PoisonClaim calls
}

// Campaign runs a randomized fault campaign against a store and checks its
// guarantees. Workers in this process and in Processes child processes
// claim a small hot set of keys (same and other fingerprints), run the
// "work" (a write to a durable ledger conditioned on the fence, as the
// README tells users to), stall past their leases now and then, and settle
// with short and long retentions — or give a claim back unused (Unclaim,
// where the store has it) — some of them with a MaxAttempts, and read keys
// with Get, while faults are injected at random:
// SIGKILL of a worker process, outages and stalls of the store's server,
// Delete and Sweep of live keys. Every store operation is logged with its wall-clock
// interval; at the end the campaign checks
//
//   - that each key's history is linearizable against a sequential model of
//     the record (porcupine): a completion is replayed, never re-executed,
//     until its retention ends or the key is deleted; a settle or heartbeat
//     is accepted only from the current owner; a takeover only after the
//     lease ended; every new fence larger than every fence before it;
//     attempts counted once per claim handed out (less the claims given
//     back), and a key poisoned only when a MaxAttempts was reached; a Get
//     answers the record as it stands;
//   - that fences grow in real time across generations (deletes, sweeps,
//     expiry), and no settle was accepted after a larger fence was issued;
//   - that every replayed result was stored by an accepted (or possibly
//     accepted) settle for the same fingerprint, never by a refused one;
//   - that the ledger accepted only strictly growing fences per key, each
//     one issued by the store.
//
// The seed is printed; -campaign.seed replays the same choices (timing
// still differs), -campaign.duration runs longer.
func Campaign(t *testing.T, cfg CampaignConfig) CampaignReport {
	if cfg.Keys <= 0 {
		cfg.Keys = 6
	}
	if cfg.Goroutines <= 0 {
		cfg.Goroutines = 4
	}
	if p := os.Getenv(envCampaignProc); p != "" {
		proc, _ := strconv.Atoi(p)
		deadline, _ := strconv.ParseInt(os.Getenv(envCampaignDeadline), 10, 64)
		seed, _ := strconv.ParseUint(os.Getenv(envCampaignSeed), 10, 64)
		runChild(t, cfg, proc, os.Getenv(envCampaignDir), time.Unix(0, deadline), seed)
		return CampaignReport{}
	}
	seed := *campaignSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("campaign seed %d (replay: -campaign.seed=%d), duration %v", seed, seed, campaignDuration())
	dir := t.TempDir()
	rep := CampaignReport{Seed: seed}
	s := cfg.Open(t, cfg.Location)
	ledger := openLedger(t, dir)
	deadline := time.Now().Add(campaignDuration())

	logs := &opLog{path: filepath.Join(dir, "ops-0.log"), proc: 0}
	logs.open(t)
	var wg sync.WaitGroup
	var stats workerStats
	for g := range cfg.Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &worker{s: s, log: logs, ledger: ledger, proc: 0, keys: cfg.Keys,
				rng: rand.New(rand.NewPCG(seed, uint64(g+1))), stats: &stats}
			w.run(deadline)
		}()
	}

	procs := workerProcesses(t, cfg, "campaign", dir, deadline, seed)
	for range cfg.Processes {
		procs.Spawn()
	}
	ctx := context.Background()
	injectFaults(cfg, procs, seed, deadline, &rep, func(frng *rand.Rand, f int) {
		switch {
		case f < 8:
			// One Delete, or (one time in three) two of the same key at once,
			// as two operators might.
			key := "c" + strconv.Itoa(frng.IntN(cfg.Keys))
			var deletes sync.WaitGroup
			for range 1 + frng.IntN(3)/2 {
				deletes.Add(1)
				go func() {
					defer deletes.Done()
					id := logs.call(opInput{Kind: opDelete, Key: key})
					dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					err := s.Delete(dctx, key)
					cancel()
					logs.ret(id, outputOf(err))
				}()
				rep.Deletes++
			}
			deletes.Wait()
		default:
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, _ = s.Sweep(sctx, 0)
			cancel()
			rep.Sweeps++
		}
	})
	wg.Wait()
	procs.Wait()
	logs.close()
	rep.Stalls = int(stats.stalls.Load())
	checkCampaign(t, dir, ledger, procs.KilledMillis(), cfg, &rep)
	t.Logf("campaign report: %+v", rep)
	return rep
}

// workerProcesses are a campaign's worker processes: copies of the test
// binary re-running cfg's test in mode, killed and replaced at random.
func workerProcesses(t *testing.T, cfg CampaignConfig, mode, dir string, deadline time.Time, seed uint64) *fleet.Fleet {
	return fleet.New(t, cfg.TestName, readyLine, nil, func(proc int) []string {
		return []string{envCampaignProc + "=" + strconv.Itoa(proc), envCampaignDir + "=" + dir,
			envCampaignDeadline + "=" + strconv.FormatInt(deadline.UnixNano(), 10), envCampaignSeed + "=" + strconv.FormatUint(seed, 10),
			envMode + "=" + mode, envLocation + "=" + cfg.Location}
	})
}

// injectFaults injects faults at random until the deadline, every 150 to
// 600 ms: of ten draws, three kill a worker process (when there are any),
// two cut the store's server for 100–400 ms or (one time in three) stall it
// for 100–700 ms (where cfg says how), one in twenty fills it (cfg.Fill),
// one in twenty crashes it (cfg.Crash) and one in twenty moves its data
// (cfg.Move); the rest are other's (the draw given).
func injectFaults(cfg CampaignConfig, procs *fleet.Fleet, seed uint64, deadline time.Time, rep *CampaignReport, other func(frng *rand.Rand, f int)) {
	frng := rand.New(rand.NewPCG(seed, 0))
	for time.Now().Add(300 * time.Millisecond).Before(deadline) {
		time.Sleep(time.Duration(150+frng.IntN(450)) * time.Millisecond)
		switch f := frng.IntN(10); {
		case f < 3 && procs.Len() > 0:
			procs.KillOne(frng)
			rep.Kills++
		case f < 5 && cfg.Stall != nil && frng.IntN(3) == 0:
			cfg.Stall()
			time.Sleep(time.Duration(100+frng.IntN(600)) * time.Millisecond)
			cfg.Unstall()
			rep.ServerStalls++
		case f < 5 && cfg.Cut != nil:
			cfg.Cut()
			time.Sleep(time.Duration(100+frng.IntN(300)) * time.Millisecond)
			cfg.Restore()
			rep.Outages++
		case f == 5 && cfg.Fill != nil && frng.IntN(2) == 0:
			cfg.Fill()
			time.Sleep(time.Duration(100+frng.IntN(600)) * time.Millisecond)
			cfg.Unfill()
			rep.Fills++
		case f == 6 && cfg.Crash != nil && frng.IntN(2) == 0:
			down := time.Now().UnixNano()
			cfg.Crash()
			rep.Crashes++
			rep.CrashOutages = append(rep.CrashOutages, [2]int64{down, time.Now().UnixNano()})
		case f == 7 && cfg.Move != nil && frng.IntN(2) == 0:
			cfg.Move()
			rep.Moves++
		default:
			other(frng, f)
		}
	}
}

func runChild(t *testing.T, cfg CampaignConfig, proc int, dir string, deadline time.Time, seed uint64) {
	s := cfg.Open(t, os.Getenv(envLocation))
	fmt.Println(readyLine)
	ledger, err := sqlitestore.OpenDB(context.Background(), filepath.Join(dir, "ledger.db"), sqlitestore.DBOptions{BusyTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Close()
	logs := &opLog{path: filepath.Join(dir, "ops-"+strconv.Itoa(proc)+".log"), proc: proc}
	logs.open(t)
	defer logs.close()
	var wg sync.WaitGroup
	var stats workerStats
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &worker{s: s, log: logs, ledger: ledger, proc: proc, keys: cfg.Keys,
				rng: rand.New(rand.NewPCG(seed, uint64(proc*100+g+1))), stats: &stats}
			w.run(deadline)
		}()
	}
	wg.Wait()
}

func openLedger(t *testing.T, dir string) *sql.DB {
	db, err := sqlitestore.OpenDB(context.Background(), filepath.Join(dir, "ledger.db"), sqlitestore.DBOptions{BusyTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS ledger (k TEXT PRIMARY KEY, fence INTEGER NOT NULL);
		CREATE TABLE IF NOT EXISTS effects (seq INTEGER PRIMARY KEY AUTOINCREMENT, k TEXT NOT NULL, fence INTEGER NOT NULL, proc INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db
}

// opLog appends one JSON line per call and per return to a file of its
// own process; a process killed mid-operation leaves a call without return.
type opLog struct {
	path string
	proc int
	mu   sync.Mutex
	f    *os.File
	n    int64
}

type logLine struct {
	ID  int64     `json:"id"`
	At  int64     `json:"at"` // ms
	In  *opInput  `json:"in,omitempty"`
	Out *opOutput `json:"out,omitempty"`
}

func (l *opLog) open(t *testing.T) {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	l.f = f
}

func (l *opLog) close() { l.f.Close() }

func (l *opLog) write(line logLine) {
	b, _ := json.Marshal(line)
	b = append(b, '\n')
	l.mu.Lock()
	_, _ = l.f.Write(b) // one write per line: whole lines survive a SIGKILL
	l.mu.Unlock()
}

func (l *opLog) call(in opInput) int64 {
	l.mu.Lock()
	l.n++
	id := int64(l.proc)<<40 | l.n
	l.mu.Unlock()
	l.write(logLine{ID: id, At: time.Now().UnixMilli(), In: &in})
	return id
}

func (l *opLog) ret(id int64, out opOutput) {
	l.write(logLine{ID: id, At: time.Now().UnixMilli() + 1, Out: &out})
}

func outputOf(err error) opOutput {
	switch {
	case err == nil:
		return opOutput{Res: resOK}
	case errors.Is(err, store.ErrStaleFence):
		return opOutput{Res: resStale}
	case errors.Is(err, store.ErrNotFound):
		return opOutput{Res: resAbsent}
	}
	return opOutput{Res: resUnknown}
}

type workerStats struct{ stalls atomic.Int64 }

type worker struct {
	s      store.Store
	log    *opLog
	ledger *sql.DB
	proc   int
	keys   int
	rng    *rand.Rand
	stats  *workerStats
}

func (w *worker) ms(lo, hi int) time.Duration {
	return time.Duration(lo+w.rng.IntN(hi-lo+1)) * time.Millisecond
}

func (w *worker) run(deadline time.Time) {
	bg := context.Background()
	for time.Now().Before(deadline) {
		key := "c" + strconv.Itoa(w.rng.IntN(w.keys))
		if w.rng.IntN(8) == 0 {
			w.get(key)
			continue
		}
		fp := "A"
		if w.rng.IntN(10) == 0 {
			fp = "B"
		}
		lease, ret := w.ms(100, 400), w.ms(150, 1500)
		maxAttempts := 0
		if w.rng.IntN(4) == 0 {
			maxAttempts = 1 + w.rng.IntN(3)
		}
		in := opInput{Kind: opAcquire, Key: key, FP: fp, Lease: lease.Milliseconds(), Ret: ret.Milliseconds(), Max: maxAttempts}
		id := w.log.call(in)
		ctx, cancel := context.WithTimeout(bg, 2*time.Second)
		a, err := w.s.Acquire(ctx, store.AcquireRequest{Key: key, Fingerprint: fp, Lease: lease, Retention: ret, MaxAttempts: maxAttempts})
		cancel()
		out := outputOf(err)
		if err == nil {
			out.Outcome, out.Fence, out.State, out.Result = a.Outcome, a.Fence, a.Record.State, string(a.Record.Result)
			out.Attempts = a.Record.Attempts
			out.LeaseUntil, out.ExpiresAt = a.Record.LeaseUntil.UnixMilli(), a.Record.ExpiresAt.UnixMilli()
		}
		w.log.ret(id, out)
		if err != nil {
			time.Sleep(w.ms(100, 300)) // back off, as a client would: every failed call is one more unknown to check
			continue
		}
		if !a.Outcome.Owns() {
			time.Sleep(w.ms(0, 5))
			continue
		}
		w.execute(key, fp, a.Fence, lease, ret)
	}
}

// get reads the key's record as an operator would.
func (w *worker) get(key string) {
	id := w.log.call(opInput{Kind: opGet, Key: key})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	rec, err := w.s.Get(ctx, key)
	cancel()
	out := outputOf(err)
	if err == nil {
		out.State, out.FP, out.Fence, out.Result, out.Attempts = rec.State, rec.Fingerprint, rec.Fence, string(rec.Result), rec.Attempts
		out.LeaseUntil, out.ExpiresAt = rec.LeaseUntil.UnixMilli(), rec.ExpiresAt.UnixMilli()
	}
	w.log.ret(id, out)
}

func (w *worker) owned(in opInput, fn func(ctx context.Context) error) {
	id := w.log.call(in)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err := fn(ctx)
	cancel()
	w.log.ret(id, outputOf(err))
}

func (w *worker) execute(key, fp string, fence uint64, lease, ret time.Duration) {
	if u, ok := w.s.(store.Unclaimer); ok && w.rng.IntN(10) == 0 {
		// Nothing ran under the claim (the caller failed before the work):
		// give it back with its attempt.
		if w.rng.IntN(4) == 0 {
			// ... or, at an attempt limit of its own, poison the key.
			w.owned(opInput{Kind: opPoison, Key: key, Fence: fence}, func(ctx context.Context) error { return u.PoisonClaim(ctx, key, fence) })
			return
		}
		w.owned(opInput{Kind: opUnclaim, Key: key, Fence: fence}, func(ctx context.Context) error { return u.Unclaim(ctx, key, fence) })
		return
	}
	if w.rng.IntN(12) == 0 { // a GC pause: wake after the lease ended
		w.stats.stalls.Add(1)
		time.Sleep(lease + w.ms(10, 200))
	}
	if w.rng.IntN(4) == 0 {
		w.owned(opInput{Kind: opHeartbeat, Key: key, Fence: fence, Lease: lease.Milliseconds()}, func(ctx context.Context) error {
			return w.s.Heartbeat(ctx, key, fence, lease)
		})
	}
	// The effect, conditioned on the fence (README: WHERE fence < $fence).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	tx, err := w.ledger.BeginTx(ctx, nil)
	if err == nil {
		var res sql.Result
		res, err = tx.ExecContext(ctx, `INSERT INTO ledger (k, fence) VALUES (?1, ?2)
			ON CONFLICT (k) DO UPDATE SET fence = excluded.fence WHERE excluded.fence > ledger.fence`, key, int64(fence))
		if err == nil {
			if n, _ := res.RowsAffected(); n == 1 {
				_, err = tx.ExecContext(ctx, `INSERT INTO effects (k, fence, proc) VALUES (?1, ?2, ?3)`, key, int64(fence), w.proc)
			}
		}
		if err == nil {
			_ = tx.Commit() // an effect that did not commit did not happen: the checks read the ledger
		} else {
			_ = tx.Rollback()
		}
	}
	cancel()
	result := fmt.Sprintf("%s/%s/p%d/f%d", key, fp, w.proc, fence)
	in := opInput{Kind: opComplete, Key: key, Fence: fence, Result: result, Ret: ret.Milliseconds()}
	switch r := w.rng.IntN(10); {
	case r < 7:
		w.owned(in, func(ctx context.Context) error { return w.s.Complete(ctx, key, fence, []byte(result), ret) })
	case r < 8:
		in.Kind = opFail
		w.owned(in, func(ctx context.Context) error { return w.s.Fail(ctx, key, fence, []byte(result), ret) })
	default:
		w.owned(opInput{Kind: opRelease, Key: key, Fence: fence}, func(ctx context.Context) error { return w.s.Release(ctx, key, fence) })
	}
}

// readHistory turns the logs into porcupine operations. A call without a
// return (its process was killed) and a call that ended in an error may
// have taken effect up to a second after the process died or the error
// came back: their return is set there and their result is unknown.
func readHistory(t *testing.T, dir string, killedAt map[int]int64) []porcupine.Operation {
	files, _ := filepath.Glob(filepath.Join(dir, "ops-*.log"))
	var ops []porcupine.Operation
	for _, path := range files {
		proc, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "ops-"), ".log"))
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		calls := map[int64]logLine{}
		var order []int64
		outs := map[int64]logLine{}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var l logLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				continue // a line cut by SIGKILL
			}
			if l.In != nil {
				calls[l.ID] = l
				order = append(order, l.ID)
			} else if l.Out != nil {
				outs[l.ID] = l
			}
		}
		f.Close()
		for _, id := range order {
			c := calls[id]
			in := *c.In
			in.Call = c.At
			o, ok := outs[id]
			var out opOutput
			if ok {
				out, in.Return = *o.Out, o.At
			} else {
				out = opOutput{Res: resUnknown}
				in.Return = math.MaxInt64 / 2
				if k, ok := killedAt[proc]; ok {
					in.Return = k
				}
			}
			if out.Res == resUnknown {
				in.Return += 1000
			}
			ops = append(ops, porcupine.Operation{ClientId: proc, Input: in, Call: in.Call, Output: out, Return: in.Return})
		}
	}
	return ops
}

func checkCampaign(t *testing.T, dir string, ledger *sql.DB, killedAt map[int]int64, cfg CampaignConfig, rep *CampaignReport) {
	ops := readHistory(t, dir, killedAt)
	for i := range ops {
		in := ops[i].Input.(opInput)
		in.LaxExpiry = cfg.InProgressAtExpiry
		in.LaxTakeover = cfg.TakeoverOfMomentaryClaims
		in.SettleLease = cfg.SettleExtendsLease.Milliseconds()
		ops[i].Input = in
	}
	rep.Operations = len(ops)
	byKey := map[string][]porcupine.Operation{}
	for _, op := range ops {
		in, out := op.Input.(opInput), op.Output.(opOutput)
		if out.Res == resUnknown {
			rep.Unknown++
		}
		if in.Kind == opAcquire && out.Res == resOK && out.Outcome == store.Poisoned {
			rep.PoisonedAnswers++
		}
		if in.Kind == opUnclaim || in.Kind == opPoison {
			rep.Unclaims++
		}
		k := op.Input.(opInput).Key
		byKey[k] = append(byKey[k], op)
	}
	violate := func(format string, args ...any) {
		rep.Violations++
		t.Errorf("seed %d: "+format, append([]any{rep.Seed}, args...)...)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		h := byKey[k]
		rep.HistoriesChecked++
		for i, seg := range segments(h) {
			rep.Segments++
			m := recordModel
			m.Init = func() []any { return []any{seg.init} }
			model := m.ToModel()
			began := time.Now()
			res, info := porcupine.CheckOperationsVerbose(model, seg.ops, *campaignCheck)
			if took := time.Since(began); took > 10*time.Second {
				t.Logf("key %s: segment %d (%d operations) took %v to check", k, i, len(seg.ops), took.Round(time.Second))
			}
			switch res {
			case porcupine.Illegal:
				path := filepath.Join(os.TempDir(), fmt.Sprintf("idem-campaign-%d-%s-%d.html", rep.Seed, k, i))
				_ = porcupine.VisualizePath(model, info, path)
				violate("key %s: history segment %d (%d operations) is not linearizable (visualization: %s)\n%s",
					k, i, len(seg.ops), path, explain(info, seg.ops, seg.init))
			case porcupine.Unknown:
				rep.HistoriesUnknown++
				t.Logf("key %s: linearizability check of segment %d timed out (%d operations)", k, i, len(seg.ops))
			}
		}
		checkFences(h, violate)
	}
	checkLedger(t, ledger, ops, violate, rep)
}

// checkFences: fences grow in real time; no settle or heartbeat is
// accepted once a larger fence was issued; replays show only results that a
// settle for the same fingerprint may have stored.
func checkFences(h []porcupine.Operation, violate func(string, ...any)) {
	type claim struct {
		fence     uint64
		call, ret int64
	}
	var claims []claim
	stored := map[string]bool{}  // results of accepted or possibly accepted settles
	refused := map[string]bool{} // results of refused settles
	for _, op := range h {
		in, out := op.Input.(opInput), op.Output.(opOutput)
		switch {
		case in.Kind == opAcquire && out.Res == resOK && out.Outcome.Owns():
			claims = append(claims, claim{out.Fence, op.Call, op.Return})
		case in.Kind == opComplete || in.Kind == opFail:
			if out.Res == resStale {
				refused[in.Result] = true
			} else {
				stored[in.Result] = true
			}
		}
	}
	sort.Slice(claims, func(i, j int) bool { return claims[i].call < claims[j].call })
	for i, a := range claims {
		for _, b := range claims[i+1:] {
			if a.ret < b.call && b.fence <= a.fence {
				violate("%s: fence %d issued after fence %d had been (not larger)", h[0].Input.(opInput).Key, b.fence, a.fence)
			}
		}
	}
	for _, op := range h {
		in, out := op.Input.(opInput), op.Output.(opOutput)
		if out.Res == resOK && (in.Kind == opComplete || in.Kind == opFail || in.Kind == opRelease || in.Kind == opUnclaim || in.Kind == opPoison || in.Kind == opHeartbeat) {
			for _, c := range claims {
				if c.fence > in.Fence && c.ret < op.Call {
					violate("%s: %s with fence %d accepted after fence %d was issued", in.Key, in.Kind, in.Fence, c.fence)
					break
				}
			}
		}
		if in.Kind == opAcquire && out.Res == resOK && out.Outcome == store.Replayed {
			if refused[out.Result] || !stored[out.Result] {
				violate("%s: replayed %q, which no accepted settle stored", in.Key, out.Result)
			}
			if parts := strings.Split(out.Result, "/"); len(parts) < 2 || parts[1] != in.FP {
				violate("%s: a request with fingerprint %s was replayed %q", in.Key, in.FP, out.Result)
			}
		}
	}
}

// checkLedger: the business table conditioned on the fence accepted only
// growing fences per key, each one issued by the store.
func checkLedger(t *testing.T, ledger *sql.DB, ops []porcupine.Operation, violate func(string, ...any), rep *CampaignReport) {
	issued := map[string]map[uint64]bool{}
	for _, op := range ops {
		in, out := op.Input.(opInput), op.Output.(opOutput)
		if in.Kind == opAcquire && out.Res == resOK && out.Outcome.Owns() {
			rep.Executions++
			if issued[in.Key] == nil {
				issued[in.Key] = map[uint64]bool{}
			}
			issued[in.Key][out.Fence] = true
		}
	}
	rows, err := ledger.Query(`SELECT k, fence FROM effects ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	last := map[string]uint64{}
	for rows.Next() {
		var k string
		var f int64
		if err := rows.Scan(&k, &f); err != nil {
			t.Fatal(err)
		}
		rep.LedgerAccepted++
		if uint64(f) <= last[k] {
			violate("ledger %s: fence %d accepted after %d", k, f, last[k])
		}
		last[k] = uint64(f)
		if !issued[k][uint64(f)] {
			// the acquisition's answer may have been lost with a killed
			// process; it must still be larger than every fence before
			t.Logf("ledger %s: fence %d from an acquisition whose answer was not logged", k, f)
		}
	}
}

// explain describes where the longest linearization of an illegal history
// got stuck: its last operations, the state they leave, and the earliest
// operations that could not follow.
func explain(info porcupine.LinearizationInfo, h []porcupine.Operation, init mstate) string {
	var best []porcupine.Operation
	for _, part := range info.PartialLinearizationsOperations() {
		for _, lin := range part {
			if len(lin) > len(best) {
				best = lin
			}
		}
	}
	if len(best) == 0 {
		return ""
	}
	states := []any{init}
	for _, op := range best {
		var next []any
		for _, st := range states {
			next = append(next, recordModel.Step(st, op.Input, op.Output)...)
		}
		states = next
	}
	var b strings.Builder
	from := max(0, len(best)-6)
	fmt.Fprintf(&b, "longest linearization: %d operations, ending:\n", len(best))
	for _, op := range best[from:] {
		fmt.Fprintf(&b, "  [%d,%d] p%d %s\n", op.Call, op.Return, op.ClientId, recordModel.DescribeOperation(op.Input, op.Output))
	}
	seen := map[mstate]bool{}
	for _, st := range states {
		if m := st.(mstate); !seen[m] && len(seen) < 4 {
			seen[m] = true
			fmt.Fprintf(&b, "  state %s\n", recordModel.DescribeState(st))
		}
	}
	type id struct {
		c  int
		at int64
		in opInput
	}
	done := map[id]bool{}
	for _, op := range best {
		done[id{op.ClientId, op.Call, op.Input.(opInput)}] = true
	}
	rest := slices.Clone(h)
	sort.SliceStable(rest, func(i, j int) bool { return rest[i].Call < rest[j].Call })
	n := 0
	for _, op := range rest {
		if done[id{op.ClientId, op.Call, op.Input.(opInput)}] {
			continue
		}
		fmt.Fprintf(&b, "  next: [%d,%d] p%d %s\n", op.Call, op.Return, op.ClientId, recordModel.DescribeOperation(op.Input, op.Output))
		if n++; n == 6 {
			break
		}
	}
	return b.String()
}

// segment is a part of one key's history checked on its own, from init.
type segment struct {
	ops  []porcupine.Operation
	init mstate
}

// segments cuts one key's history where its state is known whatever came
// before, at operations that overlap no other operation of the key
// (unknown results included, with their whole window):
//   - before a Delete that succeeded: the record is absent after it;
//   - after an acquisition that succeeded and handed out a claim: the
//     record is exactly what its answer says (state, fence, fingerprint,
//     lease, expiry), so the next segment starts from there, while the
//     acquisition itself is checked as the last operation of its segment.
//
// Every new segment keeps the largest fence issued before it as the floor
// new fences must exceed. Short segments keep the check's memory and time
// bounded on long campaigns; a history without such points is one segment.
func segments(h []porcupine.Operation) []segment {
	ops := slices.Clone(h)
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	var out []segment
	start := 0
	var maxReturn int64 = math.MinInt64
	var maxFence uint64
	init := mstate{}
	for i, op := range ops {
		in, o := op.Input.(opInput), op.Output.(opOutput)
		isolated := i > start && maxReturn < op.Call && (i+1 == len(ops) || ops[i+1].Call > op.Return)
		if isolated && in.Kind == opDelete && o.Res == resOK {
			out = append(out, segment{ops: ops[start:i], init: init})
			start, init = i, mstate{MaxFence: maxFence}
		}
		maxReturn = max(maxReturn, op.Return)
		if in.Kind == opAcquire && o.Res == resOK && o.Outcome.Owns() {
			maxFence = max(maxFence, o.Fence)
			if isolated && i+1 < len(ops) {
				out = append(out, segment{ops: ops[start : i+1], init: init})
				start, init = i+1, claimed(mstate{}, in, o, o.Attempts)
				init.MaxFence = maxFence
			}
		}
	}
	return append(out, segment{ops: ops[start:], init: init})
}

// campaignDuration is how long the campaign runs: -campaign.duration, or under -short at
// most fleet.ShortDuration.
func campaignDuration() time.Duration {
	return fleet.Duration("campaign.duration", *campaignDurationFlag)
}
