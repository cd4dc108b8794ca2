package storeurl

import (
	"context"
	"net/url"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/mysqlstore"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    Kind
		path    string
		wantErr string
	}{
		{in: "memory:", want: Memory},
		{in: "sqlite:idem.db", want: SQLite, path: "idem.db"},
		{in: "sqlite:///tmp/x.db?synchronous=FULL", want: SQLite, path: "/tmp/x.db"},
		{in: "postgres://postgres@127.0.0.1:5432/test", want: Postgres},
		{in: "postgresql://u@h/db?sslmode=disable", want: Postgres},
		{in: "redis://127.0.0.1:6379/0", want: Redis},
		{in: "rediss://h:6380", want: Redis},
		{in: "", wantErr: "no scheme"},
		{in: "idem.db", wantErr: "no scheme"},
		{in: "mysql://root@h/db", want: MySQL, path: "db"},
		{in: "mariadb://root:pw@h:3307/db?tls=true", want: MySQL, path: "db"},
		{in: "mysql://root:hunter2@h", wantErr: "names no database"},
		{in: "mysql://root:hunter2@h/", wantErr: "names no database"},
		{in: "mysql:h/db", wantErr: "want mysql://"},
		{in: "ftp://root:hunter2@h/db", wantErr: "unknown store URL scheme"},
		{in: "memory:x", wantErr: "nothing after"},
		{in: "sqlite:", wantErr: "needs a file path"},
		{in: "sqlite:a.db?journal=off", wantErr: "unknown sqlite option"},
		{in: "postgres:nohost", wantErr: "want postgres://"},
		{in: "redis://", wantErr: "want redis://"},
		{in: "dynamodb://idem_records", want: DynamoDB, path: "idem_records"},
		{in: "dynamodb://", wantErr: "want dynamodb://TABLE"},
		{in: "dynamodb://t/x", wantErr: "want dynamodb://TABLE"},
		{in: "dynamodb://t?region=eu-west-1", wantErr: "unknown dynamodb option"},
	}
	for _, tt := range tests {
		spec, err := Parse(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Parse(%q) error = %v, want it to mention %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || spec.Kind != tt.want || spec.Path != tt.path {
			t.Errorf("Parse(%q) = %+v, %v; want kind %s path %q", tt.in, spec, err, tt.want, tt.path)
		}
	}
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{"memory:", "sqlite:" + filepath.Join(t.TempDir(), "a.db"), "sqlite:" + filepath.Join(t.TempDir(), "b.db") + "?synchronous=FULL"} {
		s, err := Open(ctx, u, nil)
		if err != nil {
			t.Fatalf("Open(%q): %v", u, err)
		}
		s.Close()
	}
	if _, err := Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "c.db")+"?synchronous=OFF", nil); err == nil {
		t.Fatal("synchronous=OFF accepted")
	}
	if _, err := Open(ctx, "ftp://x", nil); err == nil {
		t.Fatal("unknown scheme accepted")
	}
}

// TestOpenMySQL: a mysql:// URL opens (and migrates) a mysqlstore; a
// refused login names the URL without its password.
func TestOpenMySQL(t *testing.T) {
	ctx := context.Background()
	loc := testenv.MySQLDatabase(t, "")
	s, err := Open(ctx, loc+"?idem_coalesce=0", &Options{Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*mysqlstore.Store); !ok {
		t.Fatalf("Open gave a %T", s)
	}
	a, err := s.Acquire(ctx, store.AcquireRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, Retention: time.Hour})
	if err != nil || a.Outcome != store.Acquired {
		t.Fatalf("acquire: %v %v", a.Outcome, err)
	}
	u, _ := url.Parse(loc)
	u.User = url.UserPassword("idem_nobody", "hunter2")
	if _, err := Open(ctx, u.String(), nil); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("a refused login: %v", err)
	}
	if _, err := Open(ctx, loc+"?idem_coalesce=maybe", nil); err == nil {
		t.Fatal("idem_coalesce=maybe accepted")
	}
}

// TestRefusedRedisConfigLeavesNothingOpen: a Redis URL whose options the
// store refuses (here idem_buckets with a brace in the prefix)
// fails with a nil store — not an interface holding a nil *Store — and
// leaves no connection open (the client made to ping the server is closed).
func TestRefusedRedisConfigLeavesNothingOpen(t *testing.T) {
	probe := testenv.RedisClient(t)
	defer probe.Close()
	ctx := context.Background()
	// No collection meanwhile: a leaked client's socket would be closed by
	// its finalizer once collected, hiding the leak.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	name := "idem-refused-" + strings.ReplaceAll(t.Name(), "/", "-")
	s, err := Open(ctx, testenv.RedisURL+"?idem_buckets=1&idem_prefix=%7Bp%7D&client_name="+name, nil)
	if err == nil || s != nil {
		t.Fatalf("Open = %#v, %v; want nil and the refusal", s, err)
	}
	// The server sees a closed connection go at its next read of it, which
	// may come after it answers the probe: asked until none is left.
	deadline := time.Now().Add(2 * time.Second)
	for {
		clients, err := probe.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		n := strings.Count(clients, "name="+name+" ")
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections named %s still open 2 s after the refusal", n, name)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"memory:", "sqlite:idem.db", "sqlite:a?synchronous=FULL", "postgres://u@h:5432/db", "redis://h/0", "rediss://", ":", "sqlite:%zz?%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := Parse(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "idem: ") {
				t.Fatalf("error without the idem prefix: %v", err)
			}
			return
		}
		switch spec.Kind {
		case Memory, Postgres, Redis:
		case SQLite:
			if spec.Path == "" {
				t.Fatalf("sqlite spec without a path from %q", s)
			}
		default:
			t.Fatalf("unknown kind %q from %q", spec.Kind, s)
		}
	})
}

// TestRedisURLFunctions: idem_functions=0 sends the transitions as scripts
// (EVALSHA), the default as Redis functions (FCALL); another value is
// refused.
func TestRedisURLFunctions(t *testing.T) {
	srv := testenv.StartRedisServer(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	for _, tc := range []struct{ query, sent, notSent string }{
		{"idem_functions=0", "cmdstat_evalsha:", "cmdstat_fcall:"},
		{"idem_functions=1", "cmdstat_fcall:", "cmdstat_evalsha:"},
		{"", "cmdstat_fcall:", "cmdstat_evalsha:"},
	} {
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		s, err := Open(ctx, "redis://"+srv.Addr+"/0?"+tc.query, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(ctx, store.AcquireRequest{Key: "k-" + tc.query, Lease: time.Minute, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		stats, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stats, tc.sent) || strings.Contains(stats, tc.notSent) {
			t.Errorf("%q: want %s and no %s, the server counted:\n%s", tc.query, tc.sent, tc.notSent, stats)
		}
	}
	if _, err := Open(ctx, "redis://"+srv.Addr+"/0?idem_functions=yes", nil); err == nil || !strings.Contains(err.Error(), "idem_functions") {
		t.Errorf("idem_functions=yes: %v, want it refused", err)
	}
}

// TestOpenDynamoDB: dynamodb://TABLE opens the store with the standard
// AWS configuration (here the tests' DynamoDB) and creates its table.
func TestOpenDynamoDB(t *testing.T) {
	testenv.DynamoDB(t)
	table := testenv.RandomName("idem_url_")
	s, err := Open(context.Background(), "dynamodb://"+table, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, err := s.Acquire(context.Background(), store.AcquireRequest{Key: "k", Lease: time.Second, Retention: time.Hour})
	if err != nil || a.Outcome != store.Acquired {
		t.Fatalf("%v %v", a.Outcome, err)
	}
}
