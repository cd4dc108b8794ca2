package e2e_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/inbox"
	"github.com/idemgo/idem/internal/drain"
	"github.com/idemgo/idem/internal/fleet"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
)

var (
	campaignDurationFlag = flag.Duration("e2e.campaign.duration", 8*time.Second, "how long the end-to-end campaign commits transfers and injects faults")
	campaignSeed         = flag.Uint64("e2e.campaign.seed", 0, "seed of the end-to-end campaign (0: a new one, printed)")
	campaignMaxBacklog   = flag.Int64("e2e.campaign.max-backlog", 2000, "the most transfers committed and not yet booked before the producers wait")
)

const (
	// The relays' claims and sends: short, so that claims of killed and
	// frozen relays run out, and sends are cut, many times a run.
	relayLease       = 2 * time.Second
	relaySendTimeout = 500 * time.Millisecond
	// ackWait is how long the broker waits for a consumer's ack before it
	// hands the message to another (JetStream's AckWait; RabbitMQ hands a
	// message out again when its consumer's connection ends).
	ackWait = 2 * time.Second
	// dedupWindow is JetStream's duplicate window on the campaign's stream:
	// shorter than the relays' lease, so a message that a killed relay
	// published is published again after it and reaches the stream twice —
	// the inbox, not the broker, must keep the second copy from booking.
	dedupWindow   = time.Second
	inboxConsumer = "e2e-credits"
	// accounts is how many accounts the transfers go to: enough that the
	// consumers' transactions seldom wait for each other's balance rows (a
	// batch holds its rows' locks until it commits; with eight accounts,
	// every transaction queued behind every other and, under load, the
	// consumers booked a few messages a second).
	accounts = 1000
)

// Environment of a campaign's helper process.
const (
	envRole      = "IDEM_E2E_ROLE" // "relay" or "consumer"
	envProc      = "IDEM_E2E_PROC"
	envDB        = "IDEM_E2E_DB"         // the connection string it uses
	envSchema    = "IDEM_E2E_SCHEMA"     // of every table
	envTopic     = "IDEM_E2E_TOPIC"      // the stream or queue
	envBrokerURL = "IDEM_E2E_BROKER_URL" // the broker's own URL
	envBroker    = "IDEM_E2E_BROKER"     // host:port of the broker, as this relay reaches it
	envDir       = "IDEM_E2E_DIR"        // where consumers log what they book
	readyLine    = "IDEM E2E READY"
)

// transfer is the business message: the sender debits Cents from its side
// and the receiver credits them to Account.
type transfer struct {
	Key     string `json:"key"`
	Account string `json:"account"`
	Cents   int64  `json:"cents"`
	// Seq numbers the account's transfers in the order they committed (the
	// account's row in account_seqs, locked by the transaction, makes them
	// commit one at a time): the account is the message's ordering key.
	Seq int64 `json:"seq"`
}

type transport struct {
	// broker starts a broker of the campaign's own and returns its URL (its
	// host:port is what a proxy stands in front of) and a function that
	// kills it with SIGKILL and starts it again, returning once it is back
	// (or why it is not); nil for a broker that is not the test's to kill.
	broker func(t testing.TB) (url string, crash func() error)
	// remove removes topic from the broker at url. The consumers declare
	// it (as consumers of a queue or stream usually do), so a relay may
	// publish before it exists.
	remove func(url, topic string)
	// destination names topic on the broker at url, as an outbox row does.
	destination func(url, topic string) string
	// sender is the outbox's sender for the broker.
	sender func() outbox.Sender
	// consume declares topic on the broker at url (if it is not there yet)
	// and books every message of it with r through the broker's adapter,
	// keyed by the field the sender writes its key into, until t ends.
	consume func(t testing.TB, url, topic string, r receiver)
	// depth, if set, tells how many messages of topic the broker at url
	// holds ready and how many consumers it has (for the trail of a lost
	// transfer).
	depth func(url, topic string) (ready, consumers int, err error)
	// ordered: the consumers book each ordering key's messages in the
	// order the broker holds them (Kafka: one partition per key, taken in
	// order), so the campaign checks each account's bookings come in the
	// order its transfers committed. Consumers that run messages of one
	// queue at once (JetStream, RabbitMQ) reorder them.
	ordered bool
}

// campaign runs the end-to-end campaign on tr with the books on
// PostgreSQL; testName is the calling test, which helper processes re-run.
func campaign(t *testing.T, testName string, tr transport) {
	campaignOn(t, testName, tr, postgresBooks)
}

// campaignOn runs the end-to-end campaign on tr with the books on db.
//
// Producers commit transfers: a debit row and its outbox message in one
// transaction (a sixth of them rolled back). Three relay processes send the
// outbox with the broker's sender (the key in the protocol's own field:
// Nats-Msg-Id, the AMQP message-id); three consumer processes book each
// message through the broker's adapter into the transactional inbox — one
// message a transaction (InboxHandler), or in batches (InboxBatches) —
// keyed by that field: a credit row and a balance update in the transaction that
// records the key; the consumers declare the stream or queue, and start
// once the first transfers are committed. Meanwhile relays and consumers
// are killed (SIGKILL, and
// replaced) and frozen (SIGSTOP, past the relays' lease and the broker's
// ack deadline); PostgreSQL is cut (now and then for longer than a lease)
// and stalled for the odd relays and consumers, which reach it through a
// proxy — the even ones directly: a partition; the broker is cut and
// stalled for the odd relays; and the broker and PostgreSQL, both servers
// of the test's own, are killed with SIGKILL and started again on their
// ports and files. The producers keep at most -e2e.campaign.max-backlog
// transfers unbooked (2,000). Then the faults stop and every committed transfer must be
// booked: the drain waits while transfers are booked and fails when none
// has been for a minute (or at a bound of three times the run), printing
// its progress every ten seconds; a lost transfer is reported with the
// relays' sends of it, the consumers' decisions and the broker's queue
// around its last send. It checks, on the business
// rows at both ends:
//   - never lost: every debit has its credit, and no outbox row is dead;
//   - never twice: no debit has two credits;
//   - never phantom: no credit without a committed debit (a rolled-back
//     transaction sends nothing);
//   - never someone else's: a credit carries its own debit's account,
//     amount and key, and was booked under the key its body names;
//   - the balances are the debits' sums, account by account;
//   - in order (where the transport keeps it to the consumer: Kafka): each
//     account's transfers — the account is their ordering key — booked in
//     the order they committed.
func campaignOn(t *testing.T, testName string, tr transport, db businessDB) {
	switch os.Getenv(envRole) {
	case "relay":
		runRelay(t, tr)
		return
	case "consumer":
		runConsumer(t, tr)
		return
	}
	seed := *campaignSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("end-to-end campaign seed %d (replay: -e2e.campaign.seed=%d), duration %v, the books on %s", seed, seed, campaignDuration(), db.name)
	ctx := context.Background()
	dbURL, schema, dbAddr, crashDB := db.start(t)
	books := openLedger(t, dbURL, schema)
	if err := books.migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rawBrokerURL, crash := tr.broker(t)
	topic := testenv.RandomName("IDEME2E_")
	t.Cleanup(func() { tr.remove(rawBrokerURL, topic) })
	brokerURL, err := url.Parse(rawBrokerURL)
	if err != nil {
		t.Fatal(err)
	}
	dest := tr.destination(rawBrokerURL, topic)
	dbProxy := testenv.StartProxy(t, dbAddr)
	proxiedDB := strings.Replace(dbURL, dbAddr, dbProxy.Addr(), 1)
	brokerProxy := testenv.StartProxy(t, brokerURL.Host)
	dbOutages, brokerOutages := testenv.NewOutages(dbProxy), testenv.NewOutages(brokerProxy)
	dir := t.TempDir()
	helpers := func(role string) *fleet.Fleet {
		return fleet.New(t, testName, readyLine, []string{"-e2e.campaign.duration=" + campaignDuration().String()}, func(n int) []string {
			conn, brokerAddr := dbURL, brokerURL.Host
			if n%2 == 1 {
				conn, brokerAddr = proxiedDB, brokerProxy.Addr()
			}
			return []string{envRole + "=" + role, envProc + "=" + strconv.Itoa(n), envDB + "=" + conn, envSchema + "=" + schema,
				envTopic + "=" + topic, envBrokerURL + "=" + rawBrokerURL, envBroker + "=" + brokerAddr, envDir + "=" + dir}
		})
	}
	relays, consumers := helpers("relay"), helpers("consumer")
	for range 3 {
		relays.Spawn()
	}

	deadline := time.Now().Add(campaignDuration())
	var committed, rolledBack, failedInCrash, deadlocked atomic.Int64
	// dbCrashes counts the starts and ends of PostgreSQL's crashes: odd
	// while one is under way; dbCrashEnded is when the last one ended (unix
	// ns): a pooled connection that died in it fails its next use.
	var dbCrashes, dbCrashEnded atomic.Int64
	// The consumers start — and declare the stream or queue — once the
	// first transfers are committed, so the relays' first sends find no
	// stream or queue to take them: they must stay pending until one does
	// (a broker that confirms what no queue takes, and drops it, is caught
	// here).
	first := make(chan struct{})
	var wg sync.WaitGroup
	// The producers keep at most -e2e.campaign.max-backlog transfers committed and not
	// yet booked: producers that outpace the consumers by design measure a
	// backlog, not a guarantee.
	var backlog atomic.Int64
	var paced atomic.Int64 // ns the producers waited
	countDone := make(chan struct{})
	go func() {
		defer close(countDone)
		for time.Now().Before(deadline) {
			if n, err := books.unbooked(ctx); err == nil {
				backlog.Store(int64(n))
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g+1)))
			for time.Now().Before(deadline) {
				if backlog.Load() >= *campaignMaxBacklog {
					paced.Add(int64(10 * time.Millisecond))
					time.Sleep(10 * time.Millisecond)
					continue
				}
				before := dbCrashes.Load()
				switch err := books.commitTransfer(ctx, rng, dest); {
				case errors.Is(err, errRolledBack):
					rolledBack.Add(1)
				case deadlock(err):
					// The server chose this transaction to break a cycle of
					// lock waits and rolled it back (MySQL does at an
					// outbox counter's first increment of a day, taken by
					// two transactions at once): an application runs it
					// again, as the next one here.
					deadlocked.Add(1)
				case err != nil && (before%2 == 1 || dbCrashes.Load() != before ||
					time.Since(time.Unix(0, dbCrashEnded.Load())) < 2*time.Second):
					// The database was killed meanwhile: committed or not,
					// the books at the end say which.
					failedInCrash.Add(1)
				case err != nil: // the producers reach the database directly: no other fault of the campaign's
					t.Errorf("a producer's transaction failed: %v", err)
				default:
					if committed.Add(1) == 50 {
						close(first)
					}
				}
				time.Sleep(time.Duration(2+rng.IntN(10)) * time.Millisecond)
			}
		}()
	}
	select {
	case <-first:
	case <-time.After(time.Until(deadline)):
	}
	for range 3 {
		consumers.Spawn()
	}
	history := &brokerHistory{}
	sampling := make(chan struct{})
	if tr.depth != nil {
		go func() {
			for {
				select {
				case <-sampling:
					return
				case <-time.After(500 * time.Millisecond):
				}
				ready, consumers, err := tr.depth(rawBrokerURL, topic)
				history.sample(depthSample{time.Now().UnixNano(), ready, consumers, err})
			}
		}()
	}
	defer close(sampling)
	var kills, freezes, cuts, stalls, brokerCuts, brokerStalls, brokerCrashes int
	var crashing atomic.Bool
	var crashes sync.WaitGroup
	frng := rand.New(rand.NewPCG(seed, 0))
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(150+frng.IntN(450)) * time.Millisecond)
		victims := relays // the processes this fault may hit
		if frng.IntN(2) == 0 {
			victims = consumers
		}
		switch f := frng.IntN(10); {
		case f < 2:
			victims.KillOne(frng)
			kills++
		case f < 4:
			victims.FreezeOne(frng, time.Duration(300+frng.IntN(3000))*time.Millisecond)
			freezes++
		case f == 4 && !dbOutages.Busy():
			d := time.Duration(100+frng.IntN(400)) * time.Millisecond
			if frng.IntN(4) == 0 {
				d = relayLease + 500*time.Millisecond
			}
			dbOutages.Cut(d)
			cuts++
		case f == 5 && !dbOutages.Busy():
			dbOutages.Stall(time.Duration(100+frng.IntN(2000)) * time.Millisecond)
			stalls++
		case f == 6 && !brokerOutages.Busy():
			brokerOutages.Cut(time.Duration(100+frng.IntN(900)) * time.Millisecond)
			brokerCuts++
		case f == 7 && !brokerOutages.Busy():
			brokerOutages.Stall(time.Duration(100+frng.IntN(900)) * time.Millisecond)
			brokerStalls++
		case f == 8 && crash != nil && !crashing.Load():
			// In the background: a broker takes a while to come back
			// (RabbitMQ some seconds), and the other faults go on meanwhile.
			crashing.Store(true)
			brokerCrashes++
			crashes.Go(func() {
				defer crashing.Store(false)
				from := time.Now().UnixNano()
				if err := crash(); err != nil {
					t.Error(err)
				}
				history.crashed(from, time.Now().UnixNano())
			})
		case f == 9 && dbCrashes.Load()%2 == 0 && frng.IntN(2) == 0:
			// The database killed (SIGKILL) and started again on its
			// files, in the background too: it keeps what it
			// acknowledged, and every transaction open at the kill is
			// rolled back.
			dbCrashes.Add(1)
			crashes.Go(func() {
				err := crashDB()
				dbCrashEnded.Store(time.Now().UnixNano())
				dbCrashes.Add(1)
				if err != nil {
					t.Error(err)
				}
			})
		}
	}
	crashes.Wait()
	wg.Wait()
	<-countDone
	dbOutages.Wait()
	brokerOutages.Wait()
	relays.ThawAll()
	consumers.ThawAll()
	behind, _ := books.unbooked(ctx)
	t.Logf("%d transfers committed, %d rolled back (and %d by the server: a deadlock), %d failed in a crash of the database; %d kills, %d freezes, %d cuts, %d stalls and %d crashes of the database, %d cuts and %d stalls of the broker, %d crashes of the broker; the producers waited %v for the consumers (at most %d transfers behind), %d transfers not yet booked when the faults ended",
		committed.Load(), rolledBack.Load(), deadlocked.Load(), failedInCrash.Load(), kills, freezes, cuts, stalls, dbCrashes.Load()/2, brokerCuts, brokerStalls, brokerCrashes,
		time.Duration(paced.Load()/4).Round(time.Second), *campaignMaxBacklog, behind)

	// The faults are over: every committed transfer must be booked, the
	// relays and consumers given as long as they make progress.
	res := drain.Wait(drain.Config{Stall: time.Minute, Bound: drainBound(), Logf: t.Logf}, func() (drain.Progress, error) {
		booked, err := books.booked(ctx)
		if err != nil {
			return drain.Progress{}, err
		}
		left, err := books.unbooked(ctx)
		if err != nil {
			return drain.Progress{}, err
		}
		pending, err := books.pending(ctx)
		if err != nil {
			return drain.Progress{}, err
		}
		return drain.Progress{Done: booked, Left: left + pending}, nil
	})
	if !res.Drained {
		t.Errorf("VIOLATION: transfers not booked after the faults ended: %s; the drain's curve (booked/to do every 10s): %s", res.Why, res.CurveString(10*time.Second))
	}
	relays.StopAll()
	consumers.StopAll()
	lost := books.check(t, tr.ordered)
	reportLost(t, dir, lost, history)
	decisions := decisionsLogged(dir)
	t.Logf("the inbox kept %d copies from booking again; the consumers' other decisions: %v",
		decisions["ack "+inbox.Duplicate.String()], decisions)
}

// drainBound is the longest the drain waits, however the transfers move.
func drainBound() time.Duration { return drain.Bound(campaignDuration()) }

var errRolledBack = errors.New("rolled back on purpose")

// deadlock reports whether err is the server's rollback of a transaction
// chosen to break a deadlock (SQLSTATE 40P01 on PostgreSQL, error 1213 on
// MySQL).
func deadlock(err error) bool {
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pe.Code == "40P01"
	}
	if me, ok := errors.AsType[*mysql.MySQLError](err); ok {
		return me.Number == 1213
	}
	return false
}

// runRelay is a relay process: it sends the outbox until it is killed,
// reaching the broker at envBroker.
func runRelay(t *testing.T, tr transport) {
	store := helperLedger(t).relayStore()
	u, err := url.Parse(os.Getenv(envBrokerURL))
	if err != nil {
		t.Fatal(err)
	}
	sender, brokerHost, via := tr.sender(), u.Host, os.Getenv(envBroker)
	proc, _ := strconv.Atoi(os.Getenv(envProc))
	sends := openTrail(t, os.Getenv(envDir), "sends-"+strconv.Itoa(proc)+".log")
	batch, concurrency := 8, 4 // half the relays send small batches four at a time, the others long ones one at a time
	if proc%2 == 0 {
		batch, concurrency = 64, 1
	}
	r, err := outbox.NewRelay(outbox.RelayConfig{
		Store: store, Batch: batch, Concurrency: concurrency, Lease: relayLease, SendTimeout: relaySendTimeout,
		PollInterval: 100 * time.Millisecond, BackoffMin: 20 * time.Millisecond, BackoffMax: 300 * time.Millisecond,
		MaxTries: 1000, // a message dies only when the broker refuses it for good
		Sender: outbox.SenderFunc(func(ctx context.Context, m *outbox.Message) outbox.Result {
			routed := *m // through this relay's way to the broker
			routed.Destination = strings.Replace(m.Destination, brokerHost, via, 1)
			res := sender.Send(ctx, &routed)
			detail := ""
			if res.Err != nil {
				detail = res.Err.Error()
			}
			sends.add(proc, m.Key, "send "+string(res.Status), detail)
			return res
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	fmt.Println(readyLine)
	time.Sleep(campaignDuration() + drainBound() + time.Minute) // the campaign kills it before
}

// runConsumer is a consumer process: it books the topic's messages until
// it is killed — the odd ones one message a transaction, the even ones in
// batches — and logs each copy the inbox kept from booking again.
func runConsumer(t *testing.T, tr transport) {
	proc, _ := strconv.Atoi(os.Getenv(envProc))
	decisions := openTrail(t, os.Getenv(envDir), "decisions-"+strconv.Itoa(proc)+".log")
	tr.consume(t, os.Getenv(envBrokerURL), os.Getenv(envTopic), helperLedger(t).receiver(proc, proc%2 == 0, func(key string, d broker.Decision) {
		decisions.add(proc, key, d.Verdict.String(), strings.ReplaceAll(d.Reason, key, "KEY"))
	}))
	fmt.Println(readyLine)
	time.Sleep(campaignDuration() + drainBound() + time.Minute)
}

// decisionsLogged counts the decisions the consumers logged, but the acks
// of messages booked, by verdict and reason: an ack "duplicate" is a copy
// the inbox kept from booking again.
func decisionsLogged(dir string) map[string]int {
	n := map[string]int{}
	for _, e := range readTrail(dir, "decisions-*.log") {
		reason := e.detail
		if e.what == "ack" && reason == inbox.Processed.String() {
			continue
		}
		if len(reason) > 100 {
			reason = reason[:100] + "…"
		}
		n[e.what+" "+reason]++
	}
	return n
}

// campaignDuration is how long the campaign runs: -e2e.campaign.duration, or under -short at
// most fleet.ShortDuration.
func campaignDuration() time.Duration {
	return fleet.Duration("e2e.campaign.duration", *campaignDurationFlag)
}
