package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/senders"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
	"github.com/idemgo/idem/store/mysqlstore"
)

func main() {
	pgURL := flag.String("pg", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL")
	natsURL := flag.String("nats", "nats://127.0.0.1:4222", "NATS URL")
	n := flag.Int("n", 50000, "rows per system")
	concurrency := flag.Int("concurrency", 64, "idem relay: sends at once")
	batch := flag.Int("batch", 1000, "idem relay: rows per claim; watermill: SubscribeBatchSize")
	orderingKeys := flag.Int("ordering-keys", 1000, "idem relay's second run: rows spread over this many ordering keys (0 skips it)")
	sqsEndpoint := flag.String("sqs", "", "instead of NATS and Watermill: the relay to the SQS at this endpoint (http://HOST:PORT) next to a bare SendMessageBatch loop")
	mysqlURL := flag.String("mysql", "", "also the relay from this MySQL or MariaDB server (mysql://USER@HOST:PORT/DB, a database it may drop and create) to JetStream, next to PostgreSQL's")
	flag.Parse()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *pgURL+"&pool_max_conns=16")
	check(err)
	defer pool.Close()
	if *sqsEndpoint != "" {
		benchSQS(ctx, pool, *sqsEndpoint, *n, *concurrency, *batch)
		return
	}
	nc, err := nats.Connect(*natsURL)
	check(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	check(err)
	_ = js.DeleteStream(ctx, "RELAYBENCH")
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RELAYBENCH", Subjects: []string{"relaybench.>"}, Storage: jetstream.FileStorage})
	check(err)
	defer js.DeleteStream(ctx, "RELAYBENCH")
	_, err = pool.Exec(ctx, `DROP SCHEMA IF EXISTS relaybench CASCADE; CREATE SCHEMA relaybench`)
	check(err)
	defer pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS relaybench CASCADE`)
	payload := []byte(`{"order":"ORD-20261129-0001","lines":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"total_cents":12900}`)

	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.Printf("idem: %d rows", *n)
	idemRate := runIdem(ctx, pool, js, st, *natsURL, *n, *concurrency, *batch, 0, payload)
	var orderedRate float64
	if *orderingKeys > 0 {
		log.Printf("idem, %d ordering keys: %d rows", *orderingKeys, *n)
		orderedRate = runIdem(ctx, pool, js, st, *natsURL, *n, *concurrency, *batch, *orderingKeys, payload)
	}
	var mysqlRate float64
	if *mysqlURL != "" {
		log.Printf("idem, MySQL: %d rows", *n)
		mysqlRate = runIdemMySQL(ctx, *mysqlURL, st, *natsURL, *n, *concurrency, *batch, payload)
	}
	log.Printf("watermill: %d rows", *n)
	wmRate := runWatermill(ctx, pool, js, st, *n, *batch, payload)
	fmt.Printf("idem relay        %8.0f msg/s  (%d rows, PostgreSQL → JetStream, Nats-Msg-Id = key)\n", idemRate, *n)
	fmt.Printf("watermill-sql fwd %8.0f msg/s  (%d rows, SQL subscriber → forwarder → JetStream)\n", wmRate, *n)
	fmt.Printf("ratio %.2fx (target ≥ 2x, and idem ≥ 10,000 msg/s)\n", idemRate/wmRate)
	if *mysqlURL != "" {
		fmt.Printf("idem relay, MySQL %8.0f msg/s  %.2f of PostgreSQL's (target ≥ 0.8)\n", mysqlRate, mysqlRate/idemRate)
	}
	if *orderingKeys > 0 {
		fmt.Printf("idem relay, %d ordering keys %8.0f msg/s  %.2f of the same rows without ordering keys (target ≥ 0.8)\n", *orderingKeys, orderedRate, orderedRate/idemRate)
	}
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

func waitStream(ctx context.Context, st jetstream.Stream, want uint64) {
	for {
		info, err := st.Info(ctx)
		check(err)
		if info.State.Msgs >= want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runIdem relays n rows from a fresh outbox table to JetStream; with
// orderingKeys > 0, row i has ordering key i mod orderingKeys.
func runIdem(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, st jetstream.Stream, natsURL string, n, concurrency, batch, orderingKeys int, payload []byte) float64 {
	s, err := outbox.New(pgxv5.New(pool), outbox.Config{Schema: "relaybench"})
	check(err)
	check(s.Migrate(ctx))
	_, err = pool.Exec(ctx, `TRUNCATE relaybench.idem_outbox`)
	check(err)
	dest := natsURL + "/relaybench.idem"
	rows := make([][]any, n)
	run := strconv.Itoa(orderingKeys) + "-"
	for i := range rows {
		var ok any // NULL: no ordering key
		if orderingKeys > 0 {
			ok = "ACC-" + strconv.Itoa(i%orderingKeys)
		}
		rows[i] = []any{"ORD-" + run + strconv.Itoa(i), dest, payload, "{}", ok}
	}
	_, err = pool.CopyFrom(ctx, pgx.Identifier{"relaybench", "idem_outbox"}, []string{"key", "destination", "payload", "headers", "ordering_key"}, pgx.CopyFromRows(rows))
	check(err)
	_, err = pool.Exec(ctx, `ANALYZE relaybench.idem_outbox`)
	check(err)
	return relayTimed(ctx, s.Store, st, n, concurrency, batch)
}

// relayTimed relays the n pending rows of s to the stream st and returns
// the messages per second, from the relay's start to the last message in
// the stream.
func relayTimed(ctx context.Context, s *outbox.Store, st jetstream.Stream, n, concurrency, batch int) float64 {
	info, err := st.Info(ctx)
	check(err)
	before := info.State.Msgs
	router, closeSenders := senders.New(senders.Config{})
	defer closeSenders()
	var retries atomic.Int64
	r, err := outbox.NewRelay(outbox.RelayConfig{Store: s, Sender: router, Batch: batch, Concurrency: concurrency,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		OnResult: func(_ *outbox.Message, _ int, res outbox.Result) {
			if res.Status != outbox.Sent {
				retries.Add(1)
			}
		}})
	check(err)
	start := time.Now()
	relayAll(ctx, r, s)
	waitStream(ctx, st, before+uint64(n))
	el := time.Since(start)
	if retries.Load() > 0 {
		log.Printf("idem: %d sends were retried", retries.Load())
	}
	return float64(n) / el.Seconds()
}

// runIdemMySQL relays n rows from a fresh outbox table of the MySQL
// database at raw (dropped and made again) to JetStream.
func runIdemMySQL(ctx context.Context, raw string, st jetstream.Stream, natsURL string, n, concurrency, batch int, payload []byte) float64 {
	cfg, err := mysqlstore.ParseURL(raw)
	check(err)
	name := cfg.DBName
	adminCfg := cfg.Clone()
	adminCfg.DBName = ""
	conn, err := mysql.NewConnector(adminCfg)
	check(err)
	admin := sql.OpenDB(conn)
	_, err = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`")
	check(err)
	_, err = admin.ExecContext(ctx, "CREATE DATABASE `"+name+"`")
	check(err)
	defer admin.Close()
	defer admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS `"+name+"`")
	cfg.ParseTime, cfg.Loc = true, time.UTC
	conn, err = mysql.NewConnector(cfg)
	check(err)
	db := sql.OpenDB(conn)
	defer db.Close()
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	s, err := outbox.New(databasesql.New(db, sqldriver.MySQL), outbox.Config{})
	check(err)
	check(s.Migrate(ctx))
	dest := natsURL + "/relaybench.idem"
	const chunk = 500
	for i := 0; i < n; i += chunk {
		var b strings.Builder
		b.WriteString("INSERT INTO idem_outbox (`key`, destination, payload, headers) VALUES ")
		var args []any
		for j := i; j < min(i+chunk, n); j++ {
			if j > i {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?, ?, '{}')")
			args = append(args, "ORD-mysql-"+strconv.Itoa(j), dest, payload)
		}
		_, err := db.ExecContext(ctx, b.String(), args...)
		check(err)
	}
	return relayTimed(ctx, s.Store, st, n, concurrency, batch)
}

// relayAll runs r until no row of s is pending.
func relayAll(ctx context.Context, r *outbox.Relay, s *outbox.Store) {
	for {
		k, err := r.RunOnce(ctx)
		check(err)
		if k > 0 {
			continue
		}
		stats, err := s.Stats(ctx)
		check(err)
		if stats.Pending == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond) // failed sends wait for their backoff
	}
}

// jsPublisher is a Watermill publisher onto JetStream, the same publish
// idem's NATS sender does (Nats-Msg-Id = the message UUID).
type jsPublisher struct{ js jetstream.JetStream }

func (p jsPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		nm := nats.NewMsg(topic)
		nm.Data = m.Payload
		nm.Header.Set(nats.MsgIdHdr, m.UUID)
		if _, err := p.js.PublishMsg(context.Background(), nm); err != nil {
			return err
		}
	}
	return nil
}

func (p jsPublisher) Close() error { return nil }

func runWatermill(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, st jetstream.Stream, n, batch int, payload []byte) float64 {
	logger := watermill.NopLogger{}
	schema := wsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(topic string) string { return `"relaybench"."watermill_` + topic + `"` },
		SubscribeBatchSize:        batch,
	}
	offsets := wsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string { return `"relaybench"."watermill_offsets_` + topic + `"` },
	}
	db := wsql.BeginnerFromPgx(pool)
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	check(err)
	fwdPub := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: "forward"})
	const chunk = 500
	for i := 0; i < n; i += chunk {
		var msgs []*message.Message
		for j := i; j < min(i+chunk, n); j++ {
			msgs = append(msgs, message.NewMessage("WM-ORD-"+strconv.Itoa(j), payload)) // own ids: the stream dedups on them
		}
		check(fwdPub.Publish("relaybench.watermill", msgs...))
	}
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{SchemaAdapter: schema, OffsetsAdapter: offsets,
		InitializeSchema: true, PollInterval: 10 * time.Millisecond, ResendInterval: 10 * time.Millisecond, RetryInterval: 10 * time.Millisecond}, logger)
	check(err)
	fwd, err := forwarder.NewForwarder(sub, jsPublisher{js}, logger, forwarder.Config{ForwarderTopic: "forward"})
	check(err)
	info, err := st.Info(ctx)
	check(err)
	before := info.State.Msgs
	start := time.Now()
	go func() { _ = fwd.Run(ctx) }()
	waitStream(ctx, st, before+uint64(n))
	el := time.Since(start)
	_ = fwd.Close()
	return float64(n) / el.Seconds()
}
