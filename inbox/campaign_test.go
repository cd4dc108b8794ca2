package inbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/drain"
	"github.com/idemgo/idem/internal/fleet"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

var (
	campaignDurationFlag = flag.Duration("inbox.campaign.duration", 8*time.Second, "how long the inbox's fault campaign injects faults")
	campaignSeed         = flag.Uint64("inbox.campaign.seed", 0, "seed of the inbox's fault campaign (0: a new one, printed)")
)

// The campaign's broker: a message handed out and not acknowledged within
// deliveryLease is handed out again.
const (
	deliveryLease = time.Second
	// maxBacklog is the most messages not yet acknowledged before the
	// campaign produces no more.
	maxBacklog   = 2000
	consumerName = "campaign"
	envConsumer  = "IDEM_INBOX_CAMPAIGN_PROC"
	envLocation  = "IDEM_INBOX_CAMPAIGN_LOCATION"
	envBroker    = "IDEM_INBOX_CAMPAIGN_BROKER"
	readyLine    = "IDEM INBOX CAMPAIGN CONSUMER READY"
)

// campaignDB is the inbox and its business table on one database.
type campaignDB[TTx any] struct {
	driver  sqldriver.Driver[TTx]
	ib      *inbox.Inbox[TTx]
	effects string // the business table: a row per change made
}

func openCampaignDB[TTx any](t testing.TB, driver sqldriver.Driver[TTx], prefix string, cfg inbox.Config) campaignDB[TTx] {
	cfg.Table, cfg.VersionTable = prefix+"processed_events", prefix+"entity_versions"
	ib, err := inbox.New(driver, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	db := campaignDB[TTx]{driver: driver, ib: ib, effects: prefix + "campaign_effects"}
	if _, err := driver.Executor().Exec(ctx, `CREATE TABLE IF NOT EXISTS `+db.effects+` (id `+driver.Dialect().SerialKey()+
		`, msg_key text NOT NULL, entity text NOT NULL, version bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db
}

// delivery is one message as the campaign's broker hands it out.
type delivery struct {
	Key     string `json:"k"`
	Entity  string `json:"e,omitempty"`
	Version int64  `json:"v,omitempty"`
}

func (d delivery) event() inbox.Event {
	return inbox.Event{Consumer: consumerName, CorrelationID: d.Key, Type: "credit", Entity: d.Entity, Version: d.Version}
}

// broker hands messages out at least once: again when one is not
// acknowledged within deliveryLease, at once to a second consumer now and
// then, and again after its acknowledgement now and then (a redelivery
// from a broker that lost the ack). Versions of an entity reach it out of
// order.
type broker struct {
	mu       sync.Mutex
	rng      *rand.Rand
	msgs     []delivery
	index    map[string]int    // key → its place in msgs
	leased   map[int]time.Time // index → when its lease ends
	acked    map[int]bool
	next     int // msgs before it were handed out at least once
	versions map[string]int64
	closed   bool // no new messages
	handed   int
}

func (b *broker) produce(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for range n {
		d := delivery{Key: fmt.Sprintf("M%d", len(b.msgs))}
		if b.rng.IntN(2) == 0 {
			d.Entity = "E" + strconv.Itoa(b.rng.IntN(8))
			b.versions[d.Entity]++
			d.Version = b.versions[d.Entity]
		}
		b.index[d.Key] = len(b.msgs)
		b.msgs = append(b.msgs, d)
	}
	// Shuffle what is not out yet a little: versions arrive out of order.
	for i := b.next; i+1 < len(b.msgs); i++ {
		if b.rng.IntN(3) == 0 {
			b.msgs[i], b.msgs[i+1] = b.msgs[i+1], b.msgs[i]
			b.index[b.msgs[i].Key], b.index[b.msgs[i+1].Key] = i, i+1
		}
	}
}

func (b *broker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/fetch":
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		_ = json.NewEncoder(w).Encode(b.fetch(max(n, 1)))
	case "/ack":
		b.ack(r.URL.Query().Get("k"))
	default:
		http.NotFound(w, r)
	}
}

func (b *broker) fetch(n int) []delivery {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	var out []delivery
	give := func(i int) {
		b.leased[i] = now.Add(deliveryLease)
		out = append(out, b.msgs[i])
		b.handed++
	}
	// Redeliveries first: leases run out, and now and then a duplicate of
	// one still out or already acknowledged.
	for i, end := range b.leased {
		if len(out) == n {
			break
		}
		switch {
		case b.acked[i]:
		case now.After(end):
			give(i)
		case !b.closed && b.rng.IntN(40) == 0:
			give(i)
		}
	}
	if !b.closed && len(b.msgs) > 0 && len(out) < n && b.rng.IntN(10) == 0 {
		i := b.rng.IntN(len(b.msgs))
		if b.acked[i] {
			out = append(out, b.msgs[i])
			b.handed++
		}
	}
	for len(out) < n && b.next < len(b.msgs) {
		give(b.next)
		b.next++
	}
	return out
}

func (b *broker) ack(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i, ok := b.index[key]; ok {
		b.acked[i] = true
		delete(b.leased, i)
	}
}

// count is how many messages were produced.
func (b *broker) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.msgs)
}

func (b *broker) pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for i := range b.msgs {
		if !b.acked[i] {
			n++
		}
	}
	return n
}

// consume fetches messages from the broker and processes them until ctx
// ends: one by one (Process) or as a batch (ProcessBatch), each change
// failing now and then (so redelivered); it acknowledges what the inbox
// committed or found done.
func consume[TTx any](ctx context.Context, db campaignDB[TTx], brokerURL string, rng *rand.Rand, batch bool) {
	client := &http.Client{Timeout: 2 * time.Second}
	change := func(ctx context.Context, tx TTx, d delivery) error {
		if _, err := db.driver.UnwrapExecutor(tx).Exec(ctx, `INSERT INTO `+db.effects+` (msg_key, entity, version) VALUES ($1, $2, $3)`,
			d.Key, d.Entity, d.Version); err != nil {
			return err
		}
		if rng.IntN(10) == 0 {
			return fmt.Errorf("the change of %s failed at random", d.Key)
		}
		return nil
	}
	ack := func(key string) {
		if resp, err := client.Post(brokerURL+"/ack?k="+url.QueryEscape(key), "text/plain", nil); err == nil {
			resp.Body.Close()
		}
	}
	for ctx.Err() == nil {
		resp, err := client.Get(brokerURL + "/fetch?n=8")
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		var ds []delivery
		err = json.NewDecoder(resp.Body).Decode(&ds)
		resp.Body.Close()
		if err != nil || len(ds) == 0 {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		if batch {
			items := make([]inbox.BatchItem[TTx], len(ds))
			for n, d := range ds {
				items[n] = inbox.BatchItem[TTx]{Event: d.event(), Fn: func(ctx context.Context, tx TTx) error { return change(ctx, tx, d) }}
			}
			res, err := db.ib.ProcessBatch(pctx, items)
			if err == nil {
				for n, r := range res {
					if r.Err == nil {
						ack(ds[n].Key)
					}
				}
			}
		} else {
			for _, d := range ds {
				if _, err := db.ib.Process(pctx, d.event(), func(ctx context.Context, tx TTx) error { return change(ctx, tx, d) }); err == nil {
					ack(d.Key)
				}
			}
		}
		cancel()
	}
}

// dbFaults are what a campaign can do to the database's server: cut and
// restore, stall and unstall its connections (a proxy), crash it (SIGKILL,
// then started again on its files). nil where there is no way.
type dbFaults struct{ cut, restore, stall, unstall, crash func() }

// inboxCampaign runs the inbox's fault campaign. Consumers — goroutines of
// the test and processes of their own, killed with SIGKILL and frozen with
// SIGSTOP — take messages from a broker that delivers at least once (again
// after a lease, twice at once, again after the acknowledgement, versions
// out of order) and process them through the inbox, one by one or in
// batches, each change failing now and then; the database is cut and
// stalled for some of them (location goes through the proxy, direct does
// not), and crashed for all (where faults says how). Then the faults stop and every message must be acknowledged.
// Checked: every message's change committed exactly once, or — an entity's
// version older than one applied — not at all, its key recorded (Stale);
// each entity's changes applied in increasing version order, the newest
// version applied; every message's key in the inbox.
func inboxCampaign[TTx any](t *testing.T, testName, location, direct string, open func(t testing.TB, location string, proc int) campaignDB[TTx], faults dbFaults) {
	if p := os.Getenv(envConsumer); p != "" {
		proc, _ := strconv.Atoi(p)
		db := open(t, os.Getenv(envLocation), proc)
		fmt.Println(readyLine)
		consume(context.Background(), db, os.Getenv(envBroker), rand.New(rand.NewPCG(uint64(proc), uint64(time.Now().UnixNano()))), proc%2 == 1)
		return
	}
	seed := *campaignSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("inbox campaign seed %d (replay: -inbox.campaign.seed=%d), duration %v", seed, seed, campaignDuration())
	ctx := context.Background()
	db := open(t, location, 0)
	b := &broker{rng: rand.New(rand.NewPCG(seed, 1)), leased: map[int]time.Time{}, acked: map[int]bool{}, versions: map[string]int64{}, index: map[string]int{}}
	srv := httptest.NewServer(b)
	defer srv.Close()

	cctx, stopConsumers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			consume(cctx, db, srv.URL, rand.New(rand.NewPCG(seed, uint64(g+2))), g == 1)
		}()
	}
	procs := fleet.New(t, testName, readyLine, nil, func(n int) []string {
		loc := location
		if n%2 == 0 && direct != "" {
			loc = direct
		}
		return []string{envConsumer + "=" + strconv.Itoa(n), envLocation + "=" + loc, envBroker + "=" + srv.URL}
	})
	for range 3 {
		procs.Spawn()
	}

	var kills, freezes, outages, stalls, crashes int
	frng := rand.New(rand.NewPCG(seed, 0))
	deadline := time.Now().Add(campaignDuration())
	for time.Now().Before(deadline) {
		if n := 20 + frng.IntN(40); b.pending() < maxBacklog {
			b.produce(n)
		}
		time.Sleep(time.Duration(150+frng.IntN(450)) * time.Millisecond)
		switch f := frng.IntN(10); {
		case f < 2:
			procs.KillOne(frng)
			kills++
		case f < 4:
			procs.FreezeOne(frng, time.Duration(200+frng.IntN(2000))*time.Millisecond)
			freezes++
		case f < 6 && faults.stall != nil && frng.IntN(3) == 0:
			faults.stall()
			time.Sleep(time.Duration(100+frng.IntN(2000)) * time.Millisecond)
			faults.unstall()
			stalls++
		case f < 6 && faults.cut != nil:
			faults.cut()
			time.Sleep(time.Duration(100+frng.IntN(400)) * time.Millisecond)
			faults.restore()
			outages++
		case f == 6 && faults.crash != nil:
			faults.crash()
			crashes++
		}
	}
	procs.ThawAll()
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	t.Logf("faults over: %d messages not yet acknowledged", b.pending())
	res := drain.Wait(drain.Config{Stall: time.Minute, Bound: drain.Bound(campaignDuration()), Poll: 50 * time.Millisecond, Logf: t.Logf}, func() (drain.Progress, error) {
		left := b.pending()
		return drain.Progress{Done: b.count() - left, Left: left}, nil
	})
	if !res.Drained {
		t.Errorf("VIOLATION: messages not acknowledged after the faults ended: %s; the drain's curve (acknowledged/not every 10s): %s", res.Why, res.CurveString(10*time.Second))
	}
	stopConsumers()
	wg.Wait()
	procs.StopAll()

	// The checks, on what committed.
	violations := 0
	violate := func(format string, args ...any) {
		violations++
		if violations <= 20 {
			t.Errorf("VIOLATION: "+format, args...)
		}
	}
	type effect struct {
		id      int64
		key     string
		version int64
	}
	byKey := map[string]int{}
	byEntity := map[string][]effect{}
	// The pool may still hold a connection the last server crash broke
	// (unexpected EOF): the first query on it fails, the next dials anew.
	var rs sqldriver.Rows
	testenv.Eventually(t, 10*time.Second, "the effects read back", func() error {
		var err error
		rs, err = db.driver.Executor().Query(ctx, `SELECT id, msg_key, entity, version FROM `+db.effects+` ORDER BY id`)
		return err
	})
	for rs.Next() {
		var e effect
		var entity string
		if err := rs.Scan(&e.id, &e.key, &entity, &e.version); err != nil {
			t.Fatal(err)
		}
		byKey[e.key]++
		if entity != "" {
			byEntity[entity] = append(byEntity[entity], e)
		}
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	recorded := map[string]bool{}
	for after := ""; ; {
		rows, err := db.ib.List(ctx, consumerName, consumerName, after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			recorded[r.CorrelationID] = true
			after = r.CorrelationID
		}
		if len(rows) < 1000 {
			break
		}
	}
	applied := map[string]int64{} // entity → its newest applied version
	for entity, es := range byEntity {
		for i, e := range es {
			if i > 0 && e.version <= es[i-1].version {
				violate("%s: version %d (%s) applied after version %d (%s)", entity, e.version, e.key, es[i-1].version, es[i-1].key)
			}
			applied[entity] = max(applied[entity], e.version)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	stale := 0
	for _, m := range b.msgs {
		switch n := byKey[m.Key]; {
		case n > 1:
			violate("%s: its change committed %d times", m.Key, n)
		case n == 0 && (m.Entity == "" || m.Version >= applied[m.Entity]):
			violate("%s: acknowledged, its change never committed (entity %q version %d, newest applied %d)", m.Key, m.Entity, m.Version, applied[m.Entity])
		case n == 0:
			stale++
		}
		if !recorded[m.Key] {
			violate("%s: acknowledged, not in the inbox", m.Key)
		}
	}
	for entity, v := range b.versions {
		if applied[entity] != v {
			violate("%s: the newest version applied is %d, the newest sent %d", entity, applied[entity], v)
		}
	}
	if len(b.msgs) == 0 || len(byKey) == 0 {
		t.Errorf("the campaign did nothing: %d messages, %d changes", len(b.msgs), len(byKey))
	}
	t.Logf("inbox campaign: %d messages handed out %d times, %d changes committed, %d stale; %d kills, %d freezes, %d outages, %d stalls, %d server crashes; %d violations",
		len(b.msgs), b.handed, len(byKey), stale, kills, freezes, outages, stalls, crashes, violations)
}

// TestCampaign runs the inbox's fault campaign on a PostgreSQL server of
// the test's own through pgx (BEGIN and the claim in one round trip;
// ClaimSeparately in every other consumer process), behind a proxy for the
// test and half the consumer processes; now and then the server is killed
// with SIGKILL and started again.
func TestCampaign(t *testing.T) {
	open := func(t testing.TB, location string, proc int) campaignDB[pgx.Tx] {
		conn, schema, _ := strings.Cut(location, "\n")
		return openCampaignDB(t, pgxv5.New(testenv.CampaignPool(t, conn, nil)), schema+".", inbox.Config{ClaimSeparately: proc%4 == 3})
	}
	if loc := os.Getenv(envLocation); loc != "" {
		inboxCampaign(t, "TestCampaign", loc, "", open, dbFaults{})
		return
	}
	srv := testenv.StartPostgres(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	conn := strings.Replace(srv.URL, srv.Addr(), proxy.Addr(), 1)
	inboxCampaign(t, "TestCampaign", conn+"\npublic", srv.URL+"\npublic", open,
		dbFaults{cut: proxy.Cut, restore: proxy.Restore, stall: proxy.Stall, unstall: proxy.Unstall, crash: func() { srv.Crash(t) }})
}

// TestCampaignSQLite runs it on one SQLite file shared by every process.
func TestCampaignSQLite(t *testing.T) {
	open := func(t testing.TB, location string, _ int) campaignDB[*sql.Tx] {
		db, err := sql.Open("sqlite", "file:"+location+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return openCampaignDB(t, databasesql.New(db, sqldriver.SQLite), "", inbox.Config{})
	}
	loc := os.Getenv(envLocation)
	if loc == "" {
		loc = filepath.Join(t.TempDir(), "inbox.db")
	}
	inboxCampaign(t, "TestCampaignSQLite", loc, "", open, dbFaults{})
}

// TestCampaignMySQL runs it on a MariaDB server of the test's own through
// database/sql, behind a proxy for the test and half the consumer
// processes; now and then the server is killed with SIGKILL and started
// again.
func TestCampaignMySQL(t *testing.T) {
	open := func(t testing.TB, location string, _ int) campaignDB[*sql.Tx] {
		db := testenv.OpenMySQL(t, location+"?timeout=2s")
		return openCampaignDB(t, databasesql.New(db, sqldriver.MySQL), "", inbox.Config{})
	}
	if loc := os.Getenv(envLocation); loc != "" {
		inboxCampaign(t, "TestCampaignMySQL", loc, "", open, dbFaults{})
		return
	}
	srv := testenv.StartMariaDB(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	inboxCampaign(t, "TestCampaignMySQL", strings.Replace(srv.URL, srv.Addr(), proxy.Addr(), 1), srv.URL, open,
		dbFaults{cut: proxy.Cut, restore: proxy.Restore, stall: proxy.Stall, unstall: proxy.Unstall, crash: func() { srv.Crash(t) }})
}

// campaignDuration is how long the campaign runs: -inbox.campaign.duration, or under -short at
// most fleet.ShortDuration.
func campaignDuration() time.Duration {
	return fleet.Duration("inbox.campaign.duration", *campaignDurationFlag)
}
