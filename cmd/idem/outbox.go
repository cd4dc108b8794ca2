package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.yaml.in/yaml/v3"

	"github.com/idemgo/idem/as2"
	"github.com/idemgo/idem/console"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/as2sender"
	"github.com/idemgo/idem/outbox/httpsender"
	"github.com/idemgo/idem/outbox/senders"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/pgxv5"
	"github.com/idemgo/idem/store/mysqlstore"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/sqlitestore"
	"github.com/idemgo/idem/store/storeurl"
)

// sqlDB is the database of a sqlite:, postgres:// or mysql:// store URL,
// for the SQL components (outbox, inbox).
type sqlDB struct {
	db     *sql.DB       // SQLite or MySQL, through database/sql
	my     bool          // db is MySQL's or MariaDB's
	pool   *pgxpool.Pool // PostgreSQL, through pgx
	schema string        // idem_schema
	pgOpts []pgxv5.Option
}

func openSQLDB(ctx context.Context, raw, what string) (*sqlDB, error) {
	spec, err := storeurl.Parse(raw)
	if err != nil {
		return nil, err
	}
	switch spec.Kind {
	case storeurl.SQLite:
		db, err := sqlitestore.OpenDB(ctx, spec.Path, sqlitestore.DBOptions{Synchronous: spec.Query.Get("synchronous"), BusyTimeout: 10 * time.Second})
		if err != nil {
			return nil, err
		}
		return &sqlDB{db: db}, nil
	case storeurl.Postgres:
		u, err := url.Parse(raw)
		if err != nil {
			return nil, err
		}
		q := u.Query()
		d := &sqlDB{schema: q.Get("idem_schema")}
		bouncer := q.Get("idem_pgbouncer") == "1" || q.Get("idem_pgbouncer") == "true"
		q.Del("idem_schema")
		q.Del("idem_pgbouncer")
		u.RawQuery = q.Encode()
		cfg, err := pgxpool.ParseConfig(u.String())
		if err != nil {
			return nil, err
		}
		if !q.Has("pool_max_conns") {
			cfg.MaxConns = pgstore.DefaultMaxConns() // the relay's sends and the tools share it
		}
		if bouncer {
			// Transaction pooling: no prepared statements, and no LISTEN
			// (it would land on a server connection handed to someone
			// else): the relay polls every --poll.
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
			d.pgOpts = append(d.pgOpts, pgxv5.WithoutListen())
		}
		if d.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			return nil, err
		}
		return d, nil
	}
	if spec.Kind == storeurl.MySQL {
		db, err := openMySQL(spec.Raw)
		if err != nil {
			return nil, err
		}
		return &sqlDB{db: db, my: true}, nil
	}
	return nil, fmt.Errorf("the %s lives in a database: use sqlite:PATH, postgres://… or mysql://…, not %s", what, spec.Kind)
}

// openMySQL opens database/sql on a mysql:// (or mariadb://) URL as
// sqldriver.MySQL reads it: points in time parsed, in UTC.
func openMySQL(raw string) (*sql.DB, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	u.Scheme = "mysql"
	mc, err := mysqlstore.ParseURL(u.String())
	if err != nil {
		return nil, err
	}
	mc.ParseTime, mc.Loc = true, time.UTC
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(conn), nil
}

// dialect is the SQL dialect of d.db.
func (d *sqlDB) dialect() sqldriver.Dialect {
	if d.my {
		return sqldriver.MySQL
	}
	return sqldriver.SQLite
}

func (d *sqlDB) Close() {
	if d.db != nil {
		d.db.Close()
	}
	if d.pool != nil {
		d.pool.Close()
	}
}

// openOutbox opens the outbox tables of a sqlite:, postgres:// or mysql://
// store URL.
func openOutbox(ctx context.Context, raw string) (*outbox.Store, func(), error) {
	d, err := openSQLDB(ctx, raw, "outbox")
	if err != nil {
		return nil, nil, err
	}
	if d.db != nil {
		ob, err := outbox.New(databasesql.New(d.db, d.dialect()), outbox.Config{})
		if err != nil {
			d.Close()
			return nil, nil, err
		}
		return ob.Store, d.Close, nil
	}
	ob, err := outbox.New(pgxv5.New(d.pool, d.pgOpts...), outbox.Config{Schema: d.schema})
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	return ob.Store, func() { ob.Close(); d.Close() }, nil
}

func newOutboxCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "outbox", Short: "Write, list, retry and skip outbox messages"}
	cmd.AddCommand(newOutboxEnqueueCmd(), newOutboxLsCmd(), newOutboxRetryCmd(), newOutboxSkipCmd())
	return cmd
}

func newOutboxEnqueueCmd() *cobra.Command {
	var key, to, data, dataFile, as2File, orderingKey string
	var headers []string
	cmd := &cobra.Command{
		Use:   "enqueue --key KEY --to DESTINATION (--data STRING | --data-file F)",
		Short: "Record a message to send; again with the same payload is a no-op",
		Args:  cobra.NoArgs,
	}
	store := storeFlag(cmd)
	f := cmd.Flags()
	f.StringVar(&key, "key", "", "the idempotency key (required)")
	f.StringVar(&to, "to", "", "destination: http(s)://…, nats://HOST/SUBJECT, amqp://…?exchange=E&routing_key=R, kafka://HOST[,HOST…]/TOPIC, sqs://QUEUE-NAME, as2://PARTNER (required)")
	f.StringVar(&data, "data", "", "the payload")
	f.StringVar(&dataFile, "data-file", "", "read the payload from this file")
	f.StringArrayVar(&headers, "header", nil, "a header NAME=VALUE (repeatable)")
	f.StringVar(&orderingKey, "ordering-key", "", "send after the earlier messages of this ordering key (an aggregate's id), one at a time")
	f.StringVar(&as2File, "as2", "", "AS2 profile file: for as2://PARTNER, stores the Message-ID its asynchronous MDN will name")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if key == "" || to == "" {
			return errors.New("--key and --to are required")
		}
		if data != "" && dataFile != "" {
			return errors.New("give --data or --data-file, not both")
		}
		payload := []byte(data)
		if dataFile != "" {
			b, err := os.ReadFile(dataFile)
			if err != nil {
				return err
			}
			payload = b
		}
		m := outbox.Message{Key: key, Destination: to, Payload: payload, OrderingKey: orderingKey}
		if as2File != "" {
			if !strings.HasPrefix(to, "as2://") {
				return errors.New("--as2 is for as2://PARTNER destinations")
			}
			profile, err := as2.LoadProfile(as2File, time.Now())
			if err != nil {
				return fmt.Errorf("--as2: %w", err)
			}
			m.ExternalID = as2sender.MessageIDFor(profile, key)
		}
		for _, h := range headers {
			k, v, ok := strings.Cut(h, "=")
			if !ok || k == "" {
				return fmt.Errorf("--header %q: want NAME=VALUE", h)
			}
			if m.Headers == nil {
				m.Headers = map[string]string{}
			}
			m.Headers[k] = v
		}
		s, closeFn, err := openOutbox(cmd.Context(), *store)
		if err != nil {
			return err
		}
		defer closeFn()
		if err := s.Migrate(cmd.Context()); err != nil {
			return err
		}
		if err := s.Enqueue(cmd.Context(), m); err != nil {
			if errors.Is(err, outbox.ErrKeyReused) {
				return fmt.Errorf("key %s is already in the outbox with another destination or payload: use a new key for a new message", key)
			}
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "enqueued %s → %s (%d bytes)\n", key, to, len(payload))
		return nil
	}
	return cmd
}

type outboxJSON struct {
	Key           string     `json:"key"`
	Status        string     `json:"status"`
	Tries         int        `json:"tries"`
	Destination   string     `json:"destination"`
	LastError     string     `json:"last_error"`
	NextAttemptAt time.Time  `json:"next_attempt_at"`
	CreatedAt     time.Time  `json:"created_at"`
	SentAt        *time.Time `json:"sent_at,omitempty"`
	AckedAt       *time.Time `json:"acked_at,omitempty"`
	Bytes         int        `json:"bytes"`
	OrderingKey   string     `json:"ordering_key,omitempty"`
	BlockedBy     string     `json:"blocked_by,omitempty"`
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func newOutboxLsCmd() *cobra.Command {
	var status string
	var asJSON bool
	cmd := &cobra.Command{Use: "ls", Aliases: []string{"list"}, Short: "List outbox messages (a password in a destination shown as xxxxx)", Args: cobra.NoArgs}
	store := storeFlag(cmd)
	cmd.Flags().StringVar(&status, "status", "", "only this status: pending, sent, acked, dead or skipped")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		var st outbox.Status
		if status != "" {
			var err error
			if st, err = outbox.ParseStatus(status); err != nil {
				return err
			}
		}
		s, closeFn, err := openOutbox(cmd.Context(), *store)
		if err != nil {
			return err
		}
		defer closeFn()
		if err := s.Migrate(cmd.Context()); err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		if !asJSON {
			fmt.Fprintln(tw, "KEY\tSTATUS\tTRIES\tDESTINATION\tORDERING KEY\tNEXT ATTEMPT\tLAST ERROR")
		}
		enc := json.NewEncoder(out)
		var after int64
		for {
			rows, err := s.List(cmd.Context(), st, after, 500)
			if err != nil {
				return err
			}
			if len(rows) == 0 {
				break
			}
			after = rows[len(rows)-1].ID
			for _, r := range rows {
				if asJSON {
					if err := enc.Encode(outboxJSON{Key: r.Key, Status: string(r.Status), Tries: r.Tries, Destination: outbox.RedactDestination(r.Destination),
						LastError: r.LastError, NextAttemptAt: r.NextAttemptAt.UTC(), CreatedAt: r.CreatedAt.UTC(),
						SentAt: optTime(r.SentAt), AckedAt: optTime(r.AckedAt), Bytes: len(r.Payload),
						OrderingKey: r.OrderingKey, BlockedBy: r.BlockedBy}); err != nil {
						return err
					}
					continue
				}
				status, next, ordering := string(r.Status), "-", "-"
				if r.Status == outbox.Pending {
					next = r.NextAttemptAt.UTC().Format(time.RFC3339)
				}
				if r.BlockedBy != "" { // held back by a dead row of its ordering key
					status, next = "blocked", "after "+r.BlockedBy
				}
				if r.OrderingKey != "" {
					ordering = r.OrderingKey
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.Key, status, r.Tries, outbox.RedactDestination(r.Destination), ordering, next, preview([]byte(r.LastError)))
			}
		}
		if !asJSON {
			return tw.Flush()
		}
		return nil
	}
	return cmd
}

func newOutboxSkipCmd() *cobra.Command {
	return outboxKeysCmd("skip KEY...", "Give up on dead messages (kept as skipped): the later messages of their ordering keys go on", "skipped", (*outbox.Store).Skip)
}

func newOutboxRetryCmd() *cobra.Command {
	return outboxKeysCmd("retry KEY...", "Move dead messages back to pending, due now", "pending again", (*outbox.Store).Retry)
}

// outboxKeysCmd is a command that applies act to each key it is given,
// saying done for each that succeeded, and every failure at the end.
func outboxKeysCmd(use, short, done string, act func(s *outbox.Store, ctx context.Context, key string) error) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.MinimumNArgs(1)}
	store := storeFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, keys []string) error {
		s, closeFn, err := openOutbox(cmd.Context(), *store)
		if err != nil {
			return err
		}
		defer closeFn()
		var errs []error
		for _, k := range keys {
			if err := act(s, cmd.Context(), k); err != nil {
				errs = append(errs, err)
				continue
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", k, done)
		}
		return errors.Join(errs...)
	}
	return cmd
}

func newRelayCmd() *cobra.Command {
	var cfg outbox.RelayConfig
	var httpTimeout, keep time.Duration
	var httpRedirectSameHost bool
	var admin, as2File, adminToken, natsCreds, natsToken, amqpUser, amqpPassword string
	var natsTLSCA, natsTLSCert, natsTLSKey, httpTLSCA, httpTLSCert, httpTLSKey, httpHeaders string
	var kafkaTLSCA, kafkaTLSCert, kafkaTLSKey, kafkaSASL, kafkaUser, kafkaPassword string
	var kafkaTLS bool
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Send outbox messages until SIGTERM, the same key on every attempt",
		Long: `Claims due outbox rows (several relays may run at once), sends each by its
destination's scheme — HTTP with Idempotency-Key, NATS JetStream with Nats-Msg-Id,
AMQP with message-id, Kafka (kafka://HOST[,HOST…]/TOPIC) with Idempotency-Key
on the idempotent producer, acks from all in-sync replicas, Amazon SQS (sqs://QUEUE-NAME, the
key in the Idempotency-Key attribute and, on a FIFO queue, the MessageDeduplicationId), AS2 (as2://PARTNER, with --as2: signed and encrypted per the
partner's agreement, acked on a verified MDN) — and records the outcome: sent, acked (HTTP 2xx), or a retry
with exponential backoff and full jitter, dead after --max-tries. A killed relay's
claims expire after --lease and are retried. SIGTERM finishes the sends in flight.

Credentials are the relay's (--nats-creds, --nats-token, --amqp-user, --kafka-user,
the TLS flags), not the rows': a destination names the server and subject only. SQS takes
its region, credentials and endpoint from the standard AWS configuration (AWS_REGION,
AWS_PROFILE, the instance's role; AWS_ENDPOINT_URL_SQS for an emulator).

With OTEL_EXPORTER_OTLP_ENDPOINT set (OTEL_EXPORTER_OTLP_PROTOCOL grpc or http/protobuf),
each send is a span exported over OTLP, continuing the trace that enqueued the row, and
its context travels in the message's traceparent header.`,
		Args: cobra.NoArgs,
	}
	store := storeFlag(cmd)
	f := cmd.Flags()
	f.DurationVar(&httpTimeout, "http-timeout", 30*time.Second, "timeout of one HTTP send")
	f.BoolVar(&httpRedirectSameHost, "http-redirect-same-host", false, "follow an HTTP destination's redirects to its own scheme, host and port (by default none is followed; another host's never)")
	f.DurationVar(&cfg.BackoffMin, "backoff-min", time.Second, "first retry delay bound")
	f.DurationVar(&cfg.BackoffMax, "backoff-max", 5*time.Minute, "largest retry delay")
	f.IntVar(&cfg.MaxTries, "max-tries", 10, "attempts before a message is dead")
	f.BoolVar(&cfg.DeadRowsReleaseOrderingKeys, "dead-releases-ordering-keys", false, "send the messages behind a dead message of their ordering key (by default they wait for outbox retry or skip)")
	f.IntVar(&cfg.Concurrency, "concurrency", 32, "sends at once")
	f.IntVar(&cfg.Batch, "batch", 100, "rows claimed at once")
	f.DurationVar(&cfg.Lease, "lease", time.Minute, "how long a claim lives (a killed relay's rows come back after it)")
	f.DurationVar(&cfg.PollInterval, "poll", time.Second, "longest idle wait (PostgreSQL wakes the relay at once)")
	f.StringVar(&admin, "admin", "", "address for the console (/), /metrics and /healthz")
	f.StringVar(&as2File, "as2", "", "AS2 profile file (YAML): sends as2://PARTNER destinations")
	f.StringVar(&adminToken, "admin-token", os.Getenv("IDEM_ADMIN_TOKEN"), "token the console asks for off loopback, for every page but /healthz and /metrics (default $IDEM_ADMIN_TOKEN)")
	adminTimeouts := listenerTimeoutFlags(cmd, time.Minute)
	al := adminListenerFlags(cmd, "admin-")
	f.StringVar(&natsCreds, "nats-creds", "", "NATS credentials file (JWT and NKey seed) for every nats:// destination")
	f.StringVar(&natsToken, "nats-token", os.Getenv("IDEM_NATS_TOKEN"), "NATS authentication token for every nats:// destination (default $IDEM_NATS_TOKEN)")
	f.StringVar(&httpHeaders, "http-headers", "", "YAML file of headers to set on every HTTP(S) request to a host, e.g. its credentials: {HOST[:PORT]: {Authorization: Bearer …}}")
	f.StringVar(&httpTLSCA, "http-tls-ca", "", "PEM file of the CA that signed the HTTPS receivers' certificates (default: the system's)")
	f.StringVar(&httpTLSCert, "http-tls-cert", "", "PEM file of the relay's client certificate, for HTTPS receivers that want one (with --http-tls-key)")
	f.StringVar(&httpTLSKey, "http-tls-key", "", "PEM file of the key of --http-tls-cert")
	f.StringVar(&natsTLSCA, "nats-tls-ca", "", "PEM file of the CA that signed the NATS servers' certificates (default: the system's)")
	f.StringVar(&natsTLSCert, "nats-tls-cert", "", "PEM file of the relay's client certificate, for NATS servers that want one (with --nats-tls-key)")
	f.StringVar(&natsTLSKey, "nats-tls-key", "", "PEM file of the key of --nats-tls-cert")
	f.StringVar(&amqpUser, "amqp-user", os.Getenv("IDEM_AMQP_USER"), "AMQP user for every amqp:// destination, in place of the URL's (default $IDEM_AMQP_USER)")
	f.StringVar(&amqpPassword, "amqp-password", os.Getenv("IDEM_AMQP_PASSWORD"), "AMQP password for --amqp-user (default $IDEM_AMQP_PASSWORD)")
	f.BoolVar(&kafkaTLS, "kafka-tls", false, "connect to kafka:// destinations over TLS, trusting the system's CAs (implied by the other --kafka-tls flags)")
	f.StringVar(&kafkaTLSCA, "kafka-tls-ca", "", "PEM file of the CA that signed the Kafka brokers' certificates")
	f.StringVar(&kafkaTLSCert, "kafka-tls-cert", "", "PEM file of the relay's client certificate, for Kafka brokers that want one (with --kafka-tls-key)")
	f.StringVar(&kafkaTLSKey, "kafka-tls-key", "", "PEM file of the key of --kafka-tls-cert")
	f.StringVar(&kafkaUser, "kafka-user", os.Getenv("IDEM_KAFKA_USER"), "SASL user for every kafka:// destination (default $IDEM_KAFKA_USER)")
	f.StringVar(&kafkaPassword, "kafka-password", os.Getenv("IDEM_KAFKA_PASSWORD"), "SASL password of --kafka-user (default $IDEM_KAFKA_PASSWORD)")
	f.StringVar(&kafkaSASL, "kafka-sasl", "scram-sha-512", "SASL mechanism of --kafka-user: plain, scram-sha-256 or scram-sha-512")
	f.DurationVar(&keep, "keep", 7*24*time.Hour, "delete sent and acked messages delivered longer ago than this (every minute; 0 keeps them forever)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		s, closeFn, err := openOutbox(ctx, *store)
		if err != nil {
			return err
		}
		defer closeFn()
		if err := s.Migrate(ctx); err != nil {
			return err
		}
		natsOpts := []nats.Option{nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			fmt.Fprintf(cmd.ErrOrStderr(), "idem relay: nats: %v\n", err)
		})}
		if natsCreds != "" {
			natsOpts = append(natsOpts, nats.UserCredentials(natsCreds))
		}
		if natsToken != "" {
			natsOpts = append(natsOpts, nats.Token(natsToken))
		}
		if natsTLSCA != "" {
			natsOpts = append(natsOpts, nats.RootCAs(natsTLSCA))
		}
		if (natsTLSCert == "") != (natsTLSKey == "") {
			return errors.New("--nats-tls-cert and --nats-tls-key go together")
		}
		if natsTLSCert != "" {
			natsOpts = append(natsOpts, nats.ClientCert(natsTLSCert, natsTLSKey))
		}
		httpClient, err := httpsClient(httpTimeout, httpTLSCA, httpTLSCert, httpTLSKey)
		if err != nil {
			return err
		}
		hostHeaders, err := loadHostHeaders(httpHeaders)
		if err != nil {
			return err
		}
		sendCfg := senders.Config{HTTP: httpsender.Config{Client: httpClient, HostHeaders: hostHeaders, RedirectSameHost: httpRedirectSameHost}, NATS: natsOpts}
		if sendCfg.Kafka.ClientOptions, err = kafkaOptions(kafkaTLS, kafkaTLSCA, kafkaTLSCert, kafkaTLSKey, kafkaSASL, kafkaUser, kafkaPassword); err != nil {
			return err
		}
		if amqpUser != "" {
			sendCfg.AMQP.SASL = []amqp.Authentication{&amqp.PlainAuth{Username: amqpUser, Password: amqpPassword}}
		} else if amqpPassword != "" {
			return errors.New("--amqp-password needs --amqp-user")
		}
		router, closeSenders := senders.New(sendCfg)
		defer closeSenders()
		if as2File != "" {
			profile, err := as2.LoadProfile(as2File, time.Now())
			if err != nil {
				return fmt.Errorf("--as2: %w", err)
			}
			router["as2"] = as2sender.NewProfile(profile, httpClient)
		}
		cfg.Store, cfg.Sender, cfg.SendTimeout = s, router, httpTimeout
		tp, flushTraces, err := startTracing(ctx, "idem-relay", cmd.ErrOrStderr())
		if err != nil {
			return err
		}
		defer flushTraces()
		cfg.TracerProvider = tp
		if cfg.SendTimeout > cfg.Lease*3/4 {
			cfg.Lease = 2 * cfg.SendTimeout // room to send and to record the outcome
		}
		m := newRelayMetrics(s)
		cfg.OnResult = m.result
		r, err := outbox.NewRelay(cfg)
		if err != nil {
			return err
		}
		logf := func(format string, args ...any) { fmt.Fprintf(cmd.ErrOrStderr(), "idem relay: "+format+"\n", args...) }
		if err := al.check(); err != nil {
			return err
		}
		if admin != "" {
			ln, err := net.Listen("tcp", admin)
			if err != nil {
				return err
			}
			mux := http.NewServeMux()
			mux.Handle("GET /metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
			mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
				if _, err := s.Stats(r.Context()); err != nil {
					http.Error(w, err.Error(), http.StatusServiceUnavailable)
					return
				}
				fmt.Fprintln(w, "ok")
			})
			if err := mountConsole(mux, admin, al, console.Config{Outbox: s, Token: adminToken, History: m.history, HistoryTitle: "Sends"}); err != nil {
				ln.Close()
				return err
			}
			srv := adminTimeouts.server(al.handler(admin, mux))
			go al.serve(srv, ln)
			defer srv.Close()
			logf("admin on %s://%s (the console at /, /metrics, /healthz)", al.scheme(), ln.Addr())
		}
		if err := r.Start(ctx, func(err error) { logf("%v", err) }); err != nil {
			return err
		}
		if keep > 0 {
			go purgeLoop(ctx, s, keep, logf)
		}
		logf("relaying from %s", *store)
		<-ctx.Done()
		logf("stopping: finishing the sends in flight")
		sctx, cancel := context.WithTimeout(context.Background(), cfg.SendTimeout+5*time.Second)
		defer cancel()
		return r.Stop(sctx)
	}
	return cmd
}

// relayMetrics are the Prometheus series of idem relay.
type relayMetrics struct {
	registry *prometheus.Registry
	attempts *prometheus.CounterVec
	history  *console.History // the console's chart
}

func newRelayMetrics(s *outbox.Store) *relayMetrics {
	m := &relayMetrics{
		history:  console.NewHistory(nil),
		registry: prometheus.NewRegistry(),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_outbox_attempts_total",
			Help: "Send attempts by result: sent, acked, pending (retry later), dead (dead-lettered).",
		}, []string{"result"}),
	}
	m.registry.MustRegister(m.attempts, outboxCollector{s}, collectors.NewGoCollector())
	return m
}

func (m *relayMetrics) result(_ *outbox.Message, _ int, r outbox.Result) {
	m.attempts.WithLabelValues(string(r.Status)).Inc()
	m.history.Add(string(r.Status))
}

// outboxCollector reads the outbox's figures at each scrape.
type outboxCollector struct{ s *outbox.Store }

var (
	descPending = prometheus.NewDesc("idem_outbox_pending", "Messages waiting to be sent.", nil, nil)
	descDead    = prometheus.NewDesc("idem_outbox_dead", "Messages dead-lettered (retry with idem outbox retry).", nil, nil)
	descLag     = prometheus.NewDesc("idem_outbox_lag_seconds", "Age of the oldest pending message.", nil, nil)
)

func (c outboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPending
	ch <- descDead
	ch <- descLag
}

func (c outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.s.Stats(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descPending, err)
		return
	}
	lag := 0.0
	if !st.OldestPending.IsZero() {
		lag = time.Since(st.OldestPending).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(st.Pending))
	ch <- prometheus.MustNewConstMetric(descDead, prometheus.GaugeValue, float64(st.Dead))
	ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, lag)
}

// purgeLoop deletes delivered messages older than keep, every minute.
func purgeLoop(ctx context.Context, s *outbox.Store, keep time.Duration, logf func(string, ...any)) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for {
			n, err := s.Purge(ctx, keep, 1000)
			if err != nil {
				if ctx.Err() == nil {
					logf("purge: %v", err)
				}
				break
			}
			if n < 1000 {
				break
			}
		}
	}
}

// httpsClient is the relay's HTTP client: timeout per request, and for
// HTTPS the CA to trust (the system's when caFile is "") and a client
// certificate to show (none when certFile is "").
func httpsClient(timeout time.Duration, caFile, certFile, keyFile string) (*http.Client, error) {
	cfg, err := clientTLS("--http-", caFile, certFile, keyFile)
	if err != nil || cfg == nil {
		return &http.Client{Timeout: timeout}, err
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = cfg
	return &http.Client{Timeout: timeout, Transport: transport}, nil
}

// clientTLS is the TLS configuration of a client trusting caFile (or the
// system's CAs) and showing certFile and keyFile if given; nil when neither
// is. flag is the flags' prefix, for the errors.
func clientTLS(flag, caFile, certFile, keyFile string) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("%stls-cert and %stls-key go together", flag, flag)
	}
	if caFile == "" && certFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%stls-ca: %w", flag, err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%stls-ca: no certificate in %s", flag, caFile)
		}
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%stls-cert: %w", flag, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// kafkaOptions are the relay's Kafka client options: TLS when --kafka-tls
// or a certificate file is given, SASL when --kafka-user is.
func kafkaOptions(useTLS bool, caFile, certFile, keyFile, mechanism, user, password string) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	cfg, err := clientTLS("--kafka-", caFile, certFile, keyFile)
	if err != nil {
		return nil, err
	}
	if cfg == nil && useTLS {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if cfg != nil {
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	if user == "" {
		if password != "" {
			return nil, errors.New("--kafka-password needs --kafka-user")
		}
		return opts, nil
	}
	switch mechanism {
	case "plain":
		opts = append(opts, kgo.SASL(plain.Auth{User: user, Pass: password}.AsMechanism()))
	case "scram-sha-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: password}.AsSha256Mechanism()))
	case "scram-sha-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: password}.AsSha512Mechanism()))
	default:
		return nil, fmt.Errorf("--kafka-sasl: want plain, scram-sha-256 or scram-sha-512, got %q", mechanism)
	}
	return opts, nil
}

// loadHostHeaders reads --http-headers: a YAML map of hosts (HOST or
// HOST:PORT, as in the destination URL) to the headers the relay sets on
// every request to them. "" reads nothing.
func loadHostHeaders(path string) (map[string]http.Header, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--http-headers: %w", err)
	}
	var byHost map[string]map[string]string
	if err := yaml.Unmarshal(b, &byHost); err != nil {
		return nil, fmt.Errorf("--http-headers %s: want HOST: {Name: value}: %w", path, err)
	}
	out := make(map[string]http.Header, len(byHost))
	for host, headers := range byHost {
		h := http.Header{}
		for name, value := range headers {
			h.Set(name, value)
		}
		out[host] = h
	}
	return out, nil
}
