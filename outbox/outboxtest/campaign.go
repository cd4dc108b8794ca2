package outboxtest

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/internal/drain"
	"github.com/idemgo/idem/internal/fleet"
	"github.com/idemgo/idem/internal/keyheader"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/httpsender"
)

var (
	campaignDurationFlag = flag.Duration("outbox.campaign.duration", 8*time.Second, "how long the outbox's fault campaign injects faults")
	campaignSeed         = flag.Uint64("outbox.campaign.seed", 0, "seed of the outbox's fault campaign (0: a new one, printed)")
)

// The relays' timing in a campaign: short, so that claims run out, and
// sends are cut by their timeout, many times a run.
const (
	campaignLease       = 2400 * time.Millisecond
	campaignSendTimeout = 400 * time.Millisecond
	// maxBacklog is the most rows pending before the producers wait.
	maxBacklog = 3000
	// relayHeader names the relay process that sent an attempt.
	relayHeader = "X-Campaign-Relay"
)

// Environment of a campaign's relay process.
const (
	envRelayProc     = "IDEM_OUTBOX_CAMPAIGN_PROC"
	envRelayDir      = "IDEM_OUTBOX_CAMPAIGN_DIR"
	envRelayReceiver = "IDEM_OUTBOX_CAMPAIGN_RECEIVER"
	envRelayLocation = "IDEM_OUTBOX_CAMPAIGN_LOCATION"
	relayReadyLine   = "IDEM OUTBOX CAMPAIGN RELAY READY"
)

// CampaignConfig describes one database's outbox campaign.
type CampaignConfig[TTx any] struct {
	// TestName is the calling test; relay processes re-run it.
	TestName string
	// Location names the database as Open reads it, in every process: the
	// test's and its relay processes'.
	Location string
	// Open returns the migrated outbox at location (Backend.Outbox,
	// Backend.Driver and Backend.Config are used).
	Open func(t testing.TB, location string) Backend[TTx]
	// Processes is how many relay processes run beside the test's own
	// relay; they are killed (SIGKILL) and frozen (SIGSTOP) at random.
	// Defaults to 3.
	Processes int
	// Cut and Restore take the database away from every process and give it
	// back; Stall and Unstall hold every byte to and from it. nil where the
	// database has no server (SQLite).
	Cut, Restore, Stall, Unstall func()
	// Crash kills the database server with SIGKILL and starts it again on
	// its files, returning once it answers; nil where the server is shared
	// with other tests (or there is none).
	Crash func()
	// Direct, when set, is Location reached without the proxy behind Cut
	// and Stall: every other relay process uses it, so an outage is a
	// partition — some relays lose the database while the others go on
	// claiming what the lost ones held.
	Direct string
}

// CampaignReport counts what a campaign did.
type CampaignReport struct {
	Seed                                       uint64
	Transactions, Committed, RolledBack        int
	UnknownCommits, AloneEnqueues              int
	Attempts, Sends                            int
	Kills, Freezes, Outages, Stalls, Crashes   int
	Acks, Refusals, Retries, Purged            int
	Delivered, ExemptSends, Violations         int
	MaxAttemptsOfOneKey                        int
	ReceiverOK, ReceiverFailed, ReceiverLate   int
	ReceiverDropped, ReceiverRefused, Replayed int
	// BehindAtEnd is how many rows were pending when the faults ended;
	// Paced, how long the producers waited for the relays.
	BehindAtEnd int
	Paced       time.Duration
}

// Campaign runs the outbox's fault campaign: the sender's promise, end to
// end. Producers in this process commit messages with a business row in
// one transaction (EnqueueTx; keys from NextKeyTx or their own), roll some
// back, and enqueue others alone (Enqueue, repeated with the same key after
// an error); relays — one in this process and Processes in processes of
// their own — send them with the HTTP sender to a receiver that answers at
// random: success, 503, 409, 422 (the row dies; an operator retries it),
// processes and drops the connection, or answers after the sender gave up.
// Meanwhile the database is cut, stalled and crashed (where the config
// says how), relay processes are killed
// with SIGKILL and frozen with SIGSTOP for up to a lease and more, and an
// operator acknowledges, refuses, retries and purges rows. The producers
// keep at most maxBacklog rows pending. Then the faults stop and every
// committed message must be delivered: the drain waits while rows are
// delivered and fails when none has been for a minute (or at a bound of
// three times the run), printing its progress every ten seconds. The
// campaign checks:
//
//   - never lost: every committed message reached the receiver and its row
//     ends sent or acked (or was purged after it was);
//   - never phantom: no message of a rolled-back transaction (nor of a
//     failed one that did not commit) reached the receiver or the table, and
//     NextKeyTx never gave out a committed key again;
//   - the same key and bytes: every attempt carried the key in
//     Idempotency-Key, the committed payload and its headers;
//   - no second sender: two relays never had sends of one message out at
//     once, and no send started after the row was recorded delivered (a
//     relay frozen while it held its claim excepted: it cannot know);
//   - a row's tries never exceed the sends the relays made.
//
// The seed is printed; -outbox.campaign.seed replays its choices (timing
// still differs), -outbox.campaign.duration runs longer.
func Campaign[TTx any](t *testing.T, cfg CampaignConfig[TTx]) CampaignReport {
	if p := os.Getenv(envRelayProc); p != "" {
		proc, _ := strconv.Atoi(p)
		runRelayProcess(t, cfg, proc)
		return CampaignReport{}
	}
	if cfg.Processes <= 0 {
		cfg.Processes = 3
	}
	seed := *campaignSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("outbox campaign seed %d (replay: -outbox.campaign.seed=%d), duration %v", seed, seed, campaignDuration())
	rep := CampaignReport{Seed: seed}
	dir := t.TempDir()
	ctx := context.Background()
	b := cfg.Open(t, cfg.Location)
	orders := "campaign_orders"
	if b.Config.Schema != "" {
		orders = b.Config.Schema + "." + orders
	}
	if _, err := b.Driver.Executor().Exec(ctx, `CREATE TABLE IF NOT EXISTS `+orders+` (order_key `+b.Driver.Dialect().KeyText()+` PRIMARY KEY, payload text NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	recv := newReceiver(seed)
	srv := httptest.NewServer(recv)
	defer srv.Close()
	dest := srv.URL + "/orders"

	// The test's own relay (under the race detector with the producers).
	ownLog := openSendLog(t, dir, 0)
	own, err := outbox.NewRelay(campaignRelayConfig(b.Outbox.Store, 0, ownLog))
	if err != nil {
		t.Fatal(err)
	}
	if err := own.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	procs := fleet.New(t, cfg.TestName, relayReadyLine, []string{"-outbox.campaign.duration=" + campaignDuration().String()}, func(n int) []string {
		location := cfg.Location
		if n%2 == 0 && cfg.Direct != "" {
			location = cfg.Direct
		}
		return []string{envRelayProc + "=" + strconv.Itoa(n), envRelayDir + "=" + dir, envRelayReceiver + "=" + dest, envRelayLocation + "=" + location}
	})
	for range cfg.Processes {
		procs.Spawn()
	}

	deadline := time.Now().Add(campaignDuration())
	p := &producers[TTx]{b: b, orders: orders, dest: dest, committed: map[string]string{}, aloneUnknown: map[string]string{}}
	// The producers keep at most maxBacklog rows pending: producers that
	// outpace the relays by design measure a backlog, not a guarantee.
	counting := make(chan struct{})
	go func() {
		defer close(counting)
		for time.Now().Before(deadline) {
			if counts, err := b.Outbox.CountByStatus(ctx); err == nil {
				p.backlog.Store(counts[outbox.Pending])
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.run(rand.New(rand.NewPCG(seed, uint64(g+1))), g, deadline)
		}()
	}
	op := &operator{s: b.Outbox.Store, recv: recv, acked: map[string]bool{}, refused: map[string]bool{}}
	frng := rand.New(rand.NewPCG(seed, 0))
	for time.Now().Add(300 * time.Millisecond).Before(deadline) {
		time.Sleep(time.Duration(150+frng.IntN(450)) * time.Millisecond)
		switch f := frng.IntN(12); {
		case f < 2:
			procs.KillOne(frng)
			rep.Kills++
		case f < 4:
			procs.FreezeOne(frng, time.Duration(300+frng.IntN(3000))*time.Millisecond)
			rep.Freezes++
		case f < 6 && cfg.Stall != nil && frng.IntN(3) == 0:
			cfg.Stall()
			time.Sleep(time.Duration(100+frng.IntN(4000)) * time.Millisecond)
			cfg.Unstall()
			rep.Stalls++
		case f < 6 && cfg.Cut != nil:
			cfg.Cut()
			time.Sleep(time.Duration(100+frng.IntN(400)) * time.Millisecond)
			cfg.Restore()
			rep.Outages++
		case f == 6 && cfg.Crash != nil && frng.IntN(2) == 0:
			cfg.Crash()
			rep.Crashes++
		default:
			op.act(ctx, frng, &rep)
		}
	}
	wg.Wait()
	<-counting
	procs.ThawAll()
	if counts, err := b.Outbox.CountByStatus(ctx); err == nil {
		rep.BehindAtEnd = int(counts[outbox.Pending])
	}
	rep.Paced = time.Duration(p.paced.Load() / 4).Round(time.Second)
	t.Logf("faults over: the producers waited %v for the relays (at most %d rows pending), %d rows pending", rep.Paced, maxBacklog, rep.BehindAtEnd)

	// The faults are over: every committed message must now be delivered,
	// the relays given as long as they make progress.
	recv.draining.Store(true)
	res := drain.Wait(drain.Config{Stall: time.Minute, Bound: drain.Bound(campaignDuration()), Logf: t.Logf}, func() (drain.Progress, error) {
		op.retryDead(ctx, &rep)
		counts, err := b.Outbox.CountByStatus(ctx)
		if err != nil {
			return drain.Progress{}, err
		}
		return drain.Progress{Done: int(counts[outbox.Sent] + counts[outbox.Acked]), Left: int(counts[outbox.Pending] + counts[outbox.Dead])}, nil
	})
	if !res.Drained {
		t.Errorf("VIOLATION: rows still undelivered after the faults ended: %s; the drain's curve (delivered/undelivered every 10s): %s", res.Why, res.CurveString(10*time.Second))
		rep.Violations++
	}
	procs.StopAll()
	if err := own.Stop(ctx); err != nil {
		t.Error(err)
	}
	ownLog.close()
	srv.Close() // waits for the answers still being written
	checkOutboxCampaign(t, ctx, b, p, recv, op, procs, dir, &rep)
	t.Logf("outbox campaign report: %+v", rep)
	return rep
}

func campaignRelayConfig(s *outbox.Store, proc int, log *sendLog) outbox.RelayConfig {
	http := httpsender.New(httpsender.Config{Timeout: campaignSendTimeout})
	// Half the relays take small batches and send them four at a time,
	// the others long ones sent one at a time: those may run until their
	// claim has no time left for another send, and hand the rest back.
	batch, concurrency := 8, 4
	if proc%2 == 1 {
		batch, concurrency = 64, 1
	}
	return outbox.RelayConfig{
		Store: s, Batch: batch, Concurrency: concurrency, Lease: campaignLease, SendTimeout: campaignSendTimeout,
		PollInterval: 100 * time.Millisecond, BackoffMin: 20 * time.Millisecond, BackoffMax: 300 * time.Millisecond,
		MaxTries: 1000, // a row dies only when the receiver refuses it
		Sender: outbox.SenderFunc(func(ctx context.Context, m *outbox.Message) outbox.Result {
			sent := *m
			sent.Headers = map[string]string{relayHeader: strconv.Itoa(proc)}
			for k, v := range m.Headers {
				sent.Headers[k] = v
			}
			id := log.start(m.Key)
			res := http.Send(ctx, &sent)
			if res.Status == outbox.Acked && awaitsReceipt(m.Key) {
				res.Status = outbox.Sent
			}
			log.end(id, m.Key, res.Status)
			return res
		}),
	}
}

// awaitsReceipt tells the keys whose delivery the campaign's sender reports
// as Sent, not Acked (half of them): as a protocol whose receipt comes
// later (an AS2 MDN) would, so that the operator's Ack and Refuse — a
// positive and a negative receipt — find them.
func awaitsReceipt(key string) bool {
	h := fnv.New32a()
	h.Write([]byte(key))
	return h.Sum32()%2 == 1
}

// runRelayProcess is a relay process of a campaign: it relays until it is
// killed.
func runRelayProcess[TTx any](t *testing.T, cfg CampaignConfig[TTx], proc int) {
	b := cfg.Open(t, os.Getenv(envRelayLocation))
	log := openSendLog(t, os.Getenv(envRelayDir), proc)
	r, err := outbox.NewRelay(campaignRelayConfig(b.Outbox.Store, proc, log))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	fmt.Println(relayReadyLine)
	// The campaign kills it; a campaign that died leaves it this long.
	time.Sleep(campaignDuration() + drain.Bound(campaignDuration()) + time.Minute)
}

// sendLog is one relay's record of its sends, a JSON line as each starts
// and ends, written at once (a process killed mid-send leaves the start).
type sendLog struct {
	f    *os.File
	proc int
	n    atomic.Int64
}

type sendLine struct {
	Proc   int           `json:"p"`
	ID     int64         `json:"i"`
	Key    string        `json:"k"`
	At     int64         `json:"t"` // unix ns
	End    bool          `json:"e,omitempty"`
	Status outbox.Status `json:"s,omitempty"`
}

func openSendLog(t testing.TB, dir string, proc int) *sendLog {
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("sends-%d.log", proc)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return &sendLog{f: f, proc: proc}
}

func (l *sendLog) write(line sendLine) {
	b, _ := json.Marshal(line)
	_, _ = l.f.Write(append(b, '\n'))
}

func (l *sendLog) start(key string) int64 {
	id := l.n.Add(1)
	l.write(sendLine{Proc: l.proc, ID: id, Key: key, At: time.Now().UnixNano()})
	return id
}

func (l *sendLog) end(id int64, key string, st outbox.Status) {
	l.write(sendLine{Proc: l.proc, ID: id, Key: key, At: time.Now().UnixNano(), End: true, Status: st})
}

func (l *sendLog) close() { _ = l.f.Close() }

// receiver is the campaign's HTTP receiver: an idempotent one (it
// processes a key once and answers a repeat "replayed"), which misbehaves
// at random until the campaign drains.
type receiver struct {
	draining atomic.Bool
	mu       sync.Mutex
	rng      *rand.Rand
	attempts []attempt
	done     map[string]string // key → the payload it processed
	rep      CampaignReport
}

type attempt struct {
	Key, Payload, Trace, KeyField string
	Proc                          int
	Start                         int64
}

func newReceiver(seed uint64) *receiver {
	return &receiver{rng: rand.New(rand.NewPCG(seed, 1<<40)), done: map[string]string{}}
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now().UnixNano()
	body, _ := io.ReadAll(r.Body)
	field := r.Header.Get(httpidem.HeaderName)
	key, _ := keyheader.Parse(field, outbox.MaxKeyBytes)
	proc, _ := strconv.Atoi(r.Header.Get(relayHeader))
	rc.mu.Lock()
	rc.attempts = append(rc.attempts, attempt{Key: key, Payload: string(body), Trace: r.Header.Get("X-Trace"), KeyField: field, Proc: proc, Start: start})
	draw := rc.rng.IntN(20)
	if rc.draining.Load() {
		draw = 0
	}
	_, seen := rc.done[key]
	process := func() {
		if !seen {
			rc.done[key] = string(body)
		}
	}
	switch {
	case draw < 11:
		process()
		rc.rep.ReceiverOK++
		if seen {
			rc.rep.Replayed++
		}
		rc.mu.Unlock()
		if draw >= 8 { // three in twenty: well within the sender's timeout, but slow
			time.Sleep(campaignSendTimeout / 2)
		}
		if seen {
			w.Header().Set(httpidem.ReplayedHeader, "true")
		}
		w.WriteHeader(http.StatusCreated)
	case draw < 14:
		rc.rep.ReceiverFailed++
		rc.mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	case draw < 15:
		rc.rep.ReceiverFailed++
		rc.mu.Unlock()
		w.WriteHeader(http.StatusConflict)
	case draw < 16:
		rc.rep.ReceiverRefused++
		rc.mu.Unlock()
		http.Error(w, "refused at random by the campaign", http.StatusUnprocessableEntity)
	case draw < 18: // processed, the answer lost with the connection
		process()
		rc.rep.ReceiverDropped++
		rc.mu.Unlock()
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				_ = c.Close()
				return
			}
		}
		w.WriteHeader(http.StatusBadGateway)
	default: // processed, answered after the sender gave up
		process()
		rc.rep.ReceiverLate++
		rc.mu.Unlock()
		time.Sleep(campaignSendTimeout + 150*time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	}
}

// producers commit, roll back and enqueue messages.
type producers[TTx any] struct {
	b      Backend[TTx]
	orders string
	dest   string

	mu           sync.Mutex
	committed    map[string]string // key → payload: Enqueue alone succeeded
	aloneUnknown map[string]string // Enqueue alone that never answered success
	reused       []string          // NextKeyTx keys whose business row existed
	counts       struct{ tx, committed, rolledBack, unknown, alone int }

	backlog atomic.Int64 // rows pending, counted every 250 ms
	paced   atomic.Int64 // ns the producers waited for the relays, summed
}

func (p *producers[TTx]) run(rng *rand.Rand, g int, deadline time.Time) {
	for seq := 0; time.Now().Before(deadline); seq++ {
		if p.backlog.Load() >= maxBacklog {
			p.paced.Add(int64(10 * time.Millisecond))
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if rng.IntN(4) == 0 {
			p.alone(rng, g, seq, deadline)
		} else {
			p.transaction(rng, g, seq)
		}
	}
}

func payloadOf(key string, g, seq int) string {
	return fmt.Sprintf(`{"order":%q,"producer":%d,"seq":%d}`, key, g, seq)
}

func (p *producers[TTx]) message(key string, g, seq int) outbox.Message {
	return outbox.Message{Key: key, Destination: p.dest, Payload: []byte(payloadOf(key, g, seq)), Headers: map[string]string{"X-Trace": key}}
}

// transaction writes a business row and its message in one transaction and
// commits it, or rolls it back (one in five).
func (p *producers[TTx]) transaction(rng *rand.Rand, g, seq int) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	tx, err := p.b.Driver.Begin(ctx)
	if err != nil {
		return
	}
	defer func() { _ = p.b.Driver.Rollback(ctx, tx) }()
	key := fmt.Sprintf("T%d-%d", g, seq)
	fromCounter := rng.IntN(2) == 0
	if fromCounter {
		if key, err = p.b.Outbox.NextKeyTx(ctx, tx, "ORD", time.Now()); err != nil {
			return
		}
	}
	m := p.message(key, g, seq)
	ex := p.b.Driver.UnwrapExecutor(tx)
	var exists int
	if err := ex.QueryRow(ctx, `SELECT count(*) FROM `+p.orders+` WHERE order_key = $1`, key).Scan(&exists); err != nil {
		return
	}
	if exists > 0 {
		p.mu.Lock()
		p.reused = append(p.reused, key)
		p.mu.Unlock()
		return
	}
	if _, err := ex.Exec(ctx, `INSERT INTO `+p.orders+` (order_key, payload) VALUES ($1, $2)`, key, string(m.Payload)); err != nil {
		return
	}
	if err := p.b.Outbox.EnqueueTx(ctx, tx, m); err != nil {
		return
	}
	p.mu.Lock()
	p.counts.tx++
	p.mu.Unlock()
	if rng.IntN(5) == 0 {
		_ = p.b.Driver.Rollback(ctx, tx) // failed or not, nothing committed
		p.mu.Lock()
		p.counts.rolledBack++
		p.mu.Unlock()
		return
	}
	err = p.b.Driver.Commit(ctx, tx)
	p.mu.Lock()
	if err == nil {
		p.counts.committed++
	} else {
		p.counts.unknown++ // the business table says which
	}
	p.mu.Unlock()
}

// alone enqueues a message on its own, again with the same key and bytes
// after an error, until it succeeds or the campaign's faults end.
func (p *producers[TTx]) alone(rng *rand.Rand, g, seq int, deadline time.Time) {
	key := fmt.Sprintf("E%d-%d", g, seq)
	if rng.IntN(2) == 0 {
		var err error
		if key, err = outbox.NewUUIDKey(); err != nil {
			return
		}
	}
	m := p.message(key, g, seq)
	p.mu.Lock()
	p.counts.alone++
	p.mu.Unlock()
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := p.b.Outbox.Enqueue(ctx, m)
		cancel()
		if err == nil {
			p.mu.Lock()
			p.committed[key] = string(m.Payload)
			delete(p.aloneUnknown, key)
			p.mu.Unlock()
			return
		}
		p.mu.Lock()
		p.aloneUnknown[key] = string(m.Payload)
		p.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
}

// checkOutboxCampaign checks the campaign's guarantees (see Campaign).
func checkOutboxCampaign[TTx any](t *testing.T, ctx context.Context, b Backend[TTx], p *producers[TTx], recv *receiver, op *operator, procs *fleet.Fleet, dir string, rep *CampaignReport) {
	violate := func(format string, args ...any) {
		rep.Violations++
		if rep.Violations <= 20 {
			t.Errorf("VIOLATION: "+format, args...)
		}
	}
	// What committed: the business rows, the Enqueues that succeeded, and
	// those that did not answer but whose row is there (or was delivered).
	committed := map[string]string{}
	rs, err := b.Driver.Executor().Query(ctx, `SELECT order_key, payload FROM `+p.orders)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var k, v string
		if err := rs.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		committed[k] = v
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	rows := map[string]outbox.Row{}
	for after := int64(0); ; {
		page, err := b.Outbox.List(ctx, "", after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page {
			rows[r.Key] = r
			after = r.ID
		}
		if len(page) < 1000 {
			break
		}
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	p.mu.Lock()
	for k, v := range p.committed {
		committed[k] = v
	}
	for k, v := range p.aloneUnknown {
		r, inTable := rows[k]
		_, delivered := recv.done[k]
		if inTable && string(r.Payload) != v {
			violate("%s: enqueued alone with %q, its row holds %q", k, v, r.Payload)
		}
		if inTable || delivered {
			committed[k] = v
		}
	}
	for _, k := range p.reused {
		violate("NextKeyTx gave out %s, a key of a committed transaction, again", k)
	}
	rep.Transactions, rep.Committed, rep.RolledBack = p.counts.tx, p.counts.committed, p.counts.rolledBack
	rep.UnknownCommits, rep.AloneEnqueues = p.counts.unknown, p.counts.alone
	p.mu.Unlock()

	rrep := recv.rep
	rep.ReceiverOK, rep.ReceiverFailed, rep.ReceiverLate = rrep.ReceiverOK, rrep.ReceiverFailed, rrep.ReceiverLate
	rep.ReceiverDropped, rep.ReceiverRefused, rep.Replayed = rrep.ReceiverDropped, rrep.ReceiverRefused, rrep.Replayed
	rep.Attempts = len(recv.attempts)

	if rep.Committed == 0 || len(recv.attempts) == 0 {
		t.Errorf("the campaign did nothing: %d transactions committed, %d attempts received", rep.Committed, len(recv.attempts))
	}
	// Never phantom, never lost.
	for k, r := range rows {
		v, ok := committed[k]
		switch {
		case !ok:
			violate("%s: a row in the outbox, status %s, of nothing committed", k, r.Status)
		case string(r.Payload) != v:
			violate("%s: its row holds %q, the committed payload is %q", k, r.Payload, v)
		case r.Status != outbox.Sent && r.Status != outbox.Acked:
			violate("%s: %s after the faults ended (last error %q)", k, r.Status, r.LastError)
		}
	}
	for k, v := range committed {
		got, ok := recv.done[k]
		switch {
		case !ok && !op.acked[k]:
			violate("%s: committed, never delivered (row: %+v)", k, rows[k].Status)
		case ok && got != v:
			violate("%s: the receiver processed %q, the committed payload is %q", k, got, v)
		}
		if ok || op.acked[k] {
			rep.Delivered++
		}
	}
	// The same key and bytes on every attempt.
	perKey := map[string]int{}
	for _, a := range recv.attempts {
		perKey[a.Key]++
		v, ok := committed[a.Key]
		switch {
		case !ok:
			violate("%s: an attempt (relay %d) of nothing committed, payload %q", a.Key, a.Proc, a.Payload)
		case a.Payload != v:
			violate("%s: an attempt (relay %d) carried %q, the committed payload is %q", a.Key, a.Proc, a.Payload, v)
		case a.KeyField != keyheader.Format(a.Key) || a.Trace != a.Key:
			violate("%s: an attempt carried Idempotency-Key %q and X-Trace %q", a.Key, a.KeyField, a.Trace)
		}
	}
	for _, n := range perKey {
		rep.MaxAttemptsOfOneKey = max(rep.MaxAttemptsOfOneKey, n)
	}

	// Tries are sends made (some never reach the receiver: one whose relay
	// was frozen until its timeout passed).
	sends := readSends(t, dir, procs)
	rep.Sends = len(sends)
	byKey := map[string][]send{}
	for _, s := range sends {
		byKey[s.key] = append(byKey[s.key], s)
	}
	for k, r := range rows {
		if r.Tries > len(byKey[k]) {
			violate("%s: %d tries recorded for %d sends the relays made", k, r.Tries, len(byKey[k]))
		}
	}

	// No second sender.
	// A relay frozen between its check that the claim has time left and
	// the send's start, or during a send, cannot know its claim ran out.
	exempt := func(s send) bool {
		return s.proc != 0 && procs.FrozenDuring(s.proc, s.start-int64(500*time.Millisecond), s.end)
	}
	for k, ss := range byKey {
		sort.Slice(ss, func(i, j int) bool { return ss[i].start < ss[j].start })
		for i, a := range ss {
			if exempt(a) {
				rep.ExemptSends++
				continue
			}
			for _, c := range ss[i+1:] {
				if c.start >= a.end {
					break
				}
				if c.proc != a.proc && !exempt(c) {
					violate("%s: relay %d's send [%s, %s] and relay %d's from %s were out at once",
						k, a.proc, stamp(a.start), stamp(a.end), c.proc, stamp(c.start))
				}
			}
			r, ok := rows[k]
			if ok && !r.SentAt.IsZero() && !op.refused[k] && !op.acked[k] && a.start > r.SentAt.UnixNano()+int64(2*time.Millisecond) {
				violate("%s: relay %d started a send at %s, after the row was recorded %s at %s",
					k, a.proc, stamp(a.start), r.Status, stamp(r.SentAt.UnixNano()))
			}
		}
	}
}

func stamp(ns int64) string { return time.Unix(0, ns).Format("15:04:05.000000") }

type send struct {
	proc       int
	key        string
	start, end int64
}

// readSends reads every relay's send log. A send whose end is missing (its
// process was killed) ended when the process did, or at its timeout.
func readSends(t *testing.T, dir string, procs *fleet.Fleet) []send {
	files, err := filepath.Glob(filepath.Join(dir, "sends-*.log"))
	if err != nil {
		t.Fatal(err)
	}
	var out []send
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		open := map[int64]send{}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var l sendLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				continue // a line cut by SIGKILL
			}
			if !l.End {
				open[l.ID] = send{proc: l.Proc, key: l.Key, start: l.At}
				continue
			}
			if s, ok := open[l.ID]; ok {
				s.end = l.At
				out = append(out, s)
				delete(open, l.ID)
			}
		}
		f.Close()
		for _, s := range open {
			s.end = s.start + int64(campaignSendTimeout)
			if at, ok := procs.KilledAt(s.proc); ok && at > s.start && at < s.end {
				s.end = at
			}
			out = append(out, s)
		}
	}
	return out
}

// operator acknowledges, refuses, retries and purges rows, as an operator
// and asynchronous receipts would.
type operator struct {
	s       *outbox.Store
	recv    *receiver
	acked   map[string]bool // keys acked by the operator
	refused map[string]bool
}

func (o *operator) act(ctx context.Context, rng *rand.Rand, rep *CampaignReport) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// A key the receiver processed: its receipt may come.
	o.recv.mu.Lock()
	var key string
	if n := len(o.recv.attempts); n > 0 {
		key = o.recv.attempts[rng.IntN(n)].Key
		if _, ok := o.recv.done[key]; !ok {
			key = ""
		}
	}
	o.recv.mu.Unlock()
	switch rng.IntN(4) {
	case 0:
		if key != "" {
			o.acked[key] = true // before: an Ack that fails may have landed
			if o.s.Ack(ctx, key) == nil {
				rep.Acks++
			}
		}
	case 1:
		if key != "" {
			o.refused[key] = true
			if o.s.Refuse(ctx, key, "refused by the campaign's receipt", false) == nil {
				rep.Refusals++
			}
		}
	case 2:
		o.retryDead(ctx, rep)
	default:
		n, err := o.s.Purge(ctx, 500*time.Millisecond, 20)
		if err == nil {
			rep.Purged += n
		}
	}
}

func (o *operator) retryDead(ctx context.Context, rep *CampaignReport) {
	dead, err := o.s.List(ctx, outbox.Dead, 0, 1000)
	if err != nil {
		return
	}
	for _, r := range dead {
		if o.s.Retry(ctx, r.Key) == nil {
			rep.Retries++
		}
	}
}

// campaignDuration is how long the campaign runs: -outbox.campaign.duration, or under -short at
// most fleet.ShortDuration.
func campaignDuration() time.Duration {
	return fleet.Duration("outbox.campaign.duration", *campaignDurationFlag)
}
