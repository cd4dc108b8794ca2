package main

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	dtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
)

// TestConcurrentStartsOnAFreshDatabase starts eight idem processes at once
// on a database that has no schema yet — relays' and tools' first commands
// as containers of one deploy start together. Every one must succeed.
func TestConcurrentStartsOnAFreshDatabase(t *testing.T) {
	stores := map[string]string{"sqlite": "sqlite:" + filepath.Join(t.TempDir(), "fresh.db")}
	if testenv.Required() || probePostgres() == nil {
		testenv.ProbePostgres(t)
		schema := testenv.RandomName("idemtest_")
		stores["postgres"] = testenv.PostgresURL + "&idem_schema=" + schema
		t.Cleanup(func() {
			conn, err := pgx.Connect(context.Background(), testenv.PostgresURL)
			if err == nil {
				_, _ = conn.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
				conn.Close(context.Background())
			}
		})
	}
	if testenv.Required() || os.Getenv("IDEM_MYSQL_URL") != "" || probeMySQL() == nil {
		stores["mysql"] = testenv.MySQLDatabase(t, "")
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			commands := [][]string{
				{"outbox", "ls", "--store", store},
				{"outbox", "enqueue", "--store", store, "--key", "k-1", "--to", "http://127.0.0.1:9/x", "--data", "one"},
				{"keys", "ls", "--store", store},
				{"outbox", "ls", "--store", store},
				{"outbox", "enqueue", "--store", store, "--key", "k-2", "--to", "http://127.0.0.1:9/x", "--data", "two"},
				{"migrate", "--store", store},
				{"keys", "ls", "--store", store},
				{"outbox", "ls", "--store", store},
			}
			start := make(chan struct{})
			var wg sync.WaitGroup
			errs := make([]error, len(commands))
			outs := make([][]byte, len(commands))
			for i, args := range commands {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cmd := exec.Command(os.Args[0], args...)
					cmd.Env = append(os.Environ(), "IDEM_TEST_MAIN=1")
					<-start
					outs[i], errs[i] = cmd.CombinedOutput()
				}()
			}
			close(start)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("idem %v: %v\n%s", commands[i], err, outs[i])
				}
			}
			out, err := run(t, "outbox", "ls", "--store", store)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"k-1", "k-2"} {
				if !strings.Contains(out, k) {
					t.Errorf("intent %s was not stored:\n%s", k, out)
				}
			}
		})
	}
}

func probeMySQL() error {
	db, err := sql.Open("mysql", testenv.MySQLDSN(testenv.MySQLURL))
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Ping()
}

func probePostgres() error {
	conn, err := pgx.Connect(context.Background(), testenv.PostgresURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(context.Background())
}

// TestMigrateStatus: idem migrate prints the versions it applied; --status
// prints them without migrating.
func TestMigrateStatus(t *testing.T) {
	store := "sqlite:" + filepath.Join(t.TempDir(), "m.db")
	out, err := run(t, "migrate", "--status", "--store", store)
	if err != nil || !strings.Contains(out, "no migrations applied") {
		t.Fatalf("status of a fresh database: %q %v", out, err)
	}
	if out, err = run(t, "migrate", "--store", store); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"records", "outbox", "idempotency records"} {
		if !strings.Contains(out, want) {
			t.Errorf("idem migrate printed %q, want %s", out, want)
		}
	}
	if again, err := run(t, "migrate", "--status", "--store", store); err != nil || again != out {
		t.Fatalf("--status after migrate: %q %v, want %q", again, err, out)
	}
}

// TestMigrateSaysWhatChangesOnRedis: Redis has no schema, and idem migrate
// says what matters there instead (the function library; how buckets are
// turned on and what they need of the server).
func TestMigrateSaysWhatChangesOnRedis(t *testing.T) {
	out, err := run(t, "migrate", "--store", "redis://127.0.0.1:6379/0")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"no schema to migrate", "function library", "every process that shares a key prefix", "into their bucket", "hash-max-listpack-value"} {
		if !strings.Contains(out, want) {
			t.Fatalf("idem migrate on Redis says %q, without %q", out, want)
		}
	}
}

// TestMigrateLoadsTheFunctionLibrary: idem migrate on Redis loads the
// library the store's transitions are called in (one for a key per record,
// another for buckets), so processes whose user may not load it find it
// there; where its own user may not, it warns and fails nothing.
func TestMigrateLoadsTheFunctionLibrary(t *testing.T) {
	srv := testenv.StartRedisServer(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	libraries := func() []string {
		t.Helper()
		libs, err := c.FunctionList(ctx, redis.FunctionListQuery{}).Result()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, l := range libs {
			names = append(names, l.Name)
		}
		return names
	}
	for i, store := range []string{"redis://" + srv.Addr + "/0", "redis://" + srv.Addr + "/0?idem_buckets=1"} {
		out, err := run(t, "migrate", "--store", store)
		if err != nil {
			t.Fatal(err)
		}
		if names := libraries(); len(names) != i+1 || !strings.HasPrefix(names[i], "idem_") || !strings.Contains(out, "function library") {
			t.Fatalf("idem migrate --store %s: libraries %q, said %q", store, names, out)
		}
	}
	if err := c.Do(ctx, "ACL", "SETUSER", "nofunctions", "on", ">pw", "~*", "&*", "+@all", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	cmd := newRootCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"migrate", "--store", "redis://nofunctions:pw@" + srv.Addr + "/0?idem_buckets=1"})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut.String(), "function library was not loaded") || len(libraries()) != 2 {
		t.Errorf("idem migrate by a user denied FUNCTION: warned %q, libraries %q", errOut.String(), libraries())
	}
}

// TestMigrateWarnsOfUnsafeSettings: idem migrate, run at deployment, says
// on standard error what the store's server is set to lose — a Redis
// without an append-only file, a PostgreSQL with fsync off — and nothing
// for a server set as idem recommends.
func TestMigrateWarnsOfUnsafeSettings(t *testing.T) {
	migrate := func(t *testing.T, store string) string {
		t.Helper()
		cmd := newRootCmd()
		var out, errOut bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		cmd.SetArgs([]string{"migrate", "--store", store})
		if err := cmd.ExecuteContext(context.Background()); err != nil {
			t.Fatal(err)
		}
		return errOut.String()
	}
	bare := testenv.StartRedisServer(t, "--appendonly", "no", "--save", "")
	if got := migrate(t, "redis://"+bare.Addr+"/0"); !strings.Contains(got, "idem migrate: warning: ") || !strings.Contains(got, "no persistence") {
		t.Errorf("on a Redis without persistence idem migrate warns %q", got)
	}
	durable := testenv.StartRedisServer(t, "--appendonly", "yes", "--appendfsync", "always")
	if got := migrate(t, "redis://"+durable.Addr+"/0"); got != "" {
		t.Errorf("on a Redis with an append-only file fsynced always idem migrate warns %q", got)
	}
	unsynced := testenv.StartPostgres(t, "fsync=off")
	if got := migrate(t, unsynced.URL); !strings.Contains(got, "fsync is off") {
		t.Errorf("on a PostgreSQL with fsync off idem migrate warns %q", got)
	}
}

// TestMigratePrint: the SQL of idem migrate --print, applied by hand to an
// empty database (SQLite; PostgreSQL in a schema of its own), leaves what
// idem migrate leaves: the same versions recorded, so that idem migrate
// then applies nothing, and a store that works.
func TestMigratePrint(t *testing.T) {
	versions := func(t *testing.T, store string) string {
		t.Helper()
		out, err := run(t, "migrate", "--status", "--store", store)
		if err != nil {
			t.Fatal(err)
		}
		var rows []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			rows = append(rows, strings.Join(f[:len(f)-2], " ")) // without "applied TIME"
		}
		return strings.Join(rows, "\n")
	}
	apply := func(t *testing.T, store, script string) {
		t.Helper()
		if strings.HasPrefix(store, "mysql://") {
			// database/sql's executor of the MySQL dialect sends a script
			// a statement at a time.
			ex := databasesql.New(testenv.OpenMySQL(t, store), sqldriver.MySQL).Executor()
			if _, err := ex.Exec(context.Background(), script); err != nil {
				t.Fatalf("applying the printed SQL: %v", err)
			}
			return
		}
		if strings.HasPrefix(store, "sqlite:") {
			db, err := sql.Open("sqlite", strings.TrimPrefix(store, "sqlite:"))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.Exec(script); err != nil {
				t.Fatalf("applying the printed SQL: %v", err)
			}
			return
		}
		conn, err := pgx.Connect(context.Background(), testenv.PostgresURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), script); err != nil {
			t.Fatalf("applying the printed SQL: %v", err)
		}
	}
	pgSchema := func(t *testing.T) string {
		t.Helper()
		testenv.ProbePostgres(t)
		name := testenv.RandomName("idem_print_")
		t.Cleanup(func() {
			if conn, err := pgx.Connect(context.Background(), testenv.PostgresURL); err == nil {
				conn.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+name+` CASCADE`)
				conn.Close(context.Background())
			}
		})
		return testenv.PostgresURL + "&idem_schema=" + name
	}
	for _, kind := range []string{"sqlite", "postgres", "mysql"} {
		t.Run(kind, func(t *testing.T) {
			byHand, byIdem := "sqlite:"+filepath.Join(t.TempDir(), "hand.db"), "sqlite:"+filepath.Join(t.TempDir(), "idem.db")
			switch kind {
			case "postgres":
				byHand, byIdem = pgSchema(t), pgSchema(t)
			case "mysql":
				byHand, byIdem = testenv.MySQLDatabase(t, ""), testenv.MySQLDatabase(t, "")
			}
			script, err := run(t, "migrate", "--print", "--store", byHand)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(script, "CREATE TABLE") || !strings.Contains(script, "idem_outbox") {
				t.Fatalf("--print wrote %q", script)
			}
			apply(t, byHand, script)
			if _, err := run(t, "migrate", "--store", byIdem); err != nil {
				t.Fatal(err)
			}
			hand, want := versions(t, byHand), versions(t, byIdem)
			if hand != want {
				t.Fatalf("versions after the printed SQL:\n%s\nafter idem migrate:\n%s", hand, want)
			}
			if _, err := run(t, "migrate", "--store", byHand); err != nil {
				t.Fatal(err)
			}
			if again := versions(t, byHand); again != hand {
				t.Fatalf("idem migrate after the printed SQL applied more:\n%s", again)
			}
			out, err := run(t, "outbox", "enqueue", "--store", byHand, "--key", "K-1", "--to", "https://example.invalid/x", "--data", "{}")
			if err != nil {
				t.Fatalf("the outbox on the printed schema: %v %s", err, out)
			}
			if out, err := run(t, "keys", "ls", "--store", byHand); err != nil {
				t.Fatalf("the records on the printed schema: %v %s", err, out)
			}
		})
	}
}

// TestMigrateDynamoDB: idem migrate on dynamodb://TABLE creates the table
// with the standard AWS configuration (here the tests' DynamoDB), and
// again finds it ready; a table of another key schema is refused, saying
// what is wrong.
func TestMigrateDynamoDB(t *testing.T) {
	c := testenv.DynamoDBClient(t) // sets AWS_ENDPOINT_URL_DYNAMODB and the rest for idem's process
	table := testenv.RandomName("idem_migrate_")
	for range 2 {
		out, err := run(t, "migrate", "--store", "dynamodb://"+table)
		if err != nil || !strings.Contains(out, "is ready") {
			t.Fatalf("idem migrate: %q %v", out, err)
		}
	}
	other := testenv.RandomName("idem_other_")
	if _, err := c.CreateTable(context.Background(), &dynamodb.CreateTableInput{TableName: aws.String(other), BillingMode: dtypes.BillingModePayPerRequest,
		AttributeDefinitions: []dtypes.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: dtypes.ScalarAttributeTypeS}},
		KeySchema:            []dtypes.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: dtypes.KeyTypeHash}}}); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, "migrate", "--store", "dynamodb://"+other); err == nil || !strings.Contains(out+err.Error(), "another key schema") {
		t.Fatalf("a table of another key schema: %q %v", out, err)
	}
}
