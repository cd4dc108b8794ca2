package storeurl

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/idemgo/idem/internal/redact"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/sqlitestore"
)

// Default is the store used when none is named.
const Default = "sqlite:idem.db"

// Kind names a backend.
type Kind string

// The backends a URL can name.
const (
	Memory   Kind = "memory"
	SQLite   Kind = "sqlite"
	Postgres Kind = "postgres"
	Redis    Kind = "redis"
	DynamoDB Kind = "dynamodb"
	MySQL    Kind = "mysql"
)

// Spec is a parsed store URL.
type Spec struct {
	Kind Kind
	// Path is the SQLite file, or the DynamoDB table.
	Path string
	// Query holds the options after '?'.
	Query url.Values
	// Raw is the URL as given (for postgres and redis, handed to the client).
	Raw string
}

// Parse parses a store URL. Errors say what was expected.
func Parse(raw string) (Spec, error) {
	scheme, rest, ok := strings.Cut(raw, ":")
	if !ok || scheme == "" {
		return Spec{}, fmt.Errorf("idem: store URL %q has no scheme: want memory:, sqlite:PATH, postgres://…, mysql://…, redis://… or dynamodb://TABLE", redact.URL(raw))
	}
	switch strings.ToLower(scheme) {
	case "memory":
		if rest != "" {
			return Spec{}, fmt.Errorf("idem: store URL %q: memory: takes nothing after the colon", raw)
		}
		return Spec{Kind: Memory, Raw: raw}, nil
	case "sqlite", "sqlite3":
		rest = strings.TrimPrefix(rest, "//")
		path, query, _ := strings.Cut(rest, "?")
		if path == "" {
			return Spec{}, fmt.Errorf("idem: store URL %q: sqlite: needs a file path, as in sqlite:idem.db", raw)
		}
		if strings.ContainsRune(path, '#') {
			return Spec{}, fmt.Errorf("idem: store URL %q: the sqlite path must not contain '#'", raw)
		}
		q, err := url.ParseQuery(query)
		if err != nil {
			return Spec{}, fmt.Errorf("idem: store URL %q: bad options: %v", raw, err)
		}
		for k := range q {
			if k != "synchronous" && k != "idem_coalesce" {
				return Spec{}, fmt.Errorf("idem: store URL %q: unknown sqlite option %q (known: synchronous, idem_coalesce)", raw, k)
			}
		}
		return Spec{Kind: SQLite, Path: path, Query: q, Raw: raw}, nil
	case "postgres", "postgresql", "redis", "rediss":
		u, err := url.Parse(raw)
		if err != nil {
			return Spec{}, fmt.Errorf("idem: store URL %q: %v", redact.URL(raw), redact.ParseError(err))
		}
		if !strings.HasPrefix(rest, "//") || u.Host == "" {
			return Spec{}, fmt.Errorf("idem: store URL %q: want %s://HOST[:PORT]/…", u.Redacted(), scheme)
		}
		kind := Postgres
		if strings.HasPrefix(strings.ToLower(scheme), "redis") {
			kind = Redis
		}
		return Spec{Kind: kind, Query: u.Query(), Raw: raw}, nil
	}
	if strings.EqualFold(scheme, "mysql") || strings.EqualFold(scheme, "mariadb") {
		return parseMySQL(raw, rest)
	}
	if strings.EqualFold(scheme, "dynamodb") {
		u, err := url.Parse(raw)
		if err != nil || !strings.HasPrefix(rest, "//") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.User != nil {
			return Spec{}, fmt.Errorf("idem: store URL %q: want dynamodb://TABLE", raw)
		}
		for k := range u.Query() {
			return Spec{}, fmt.Errorf("idem: store URL %q: unknown dynamodb option %q (none are known: the region, credentials and endpoint come from the AWS configuration)", raw, k)
		}
		return Spec{Kind: DynamoDB, Path: u.Host, Raw: raw}, nil
	}
	return Spec{}, fmt.Errorf("idem: unknown store URL scheme %q in %q: want memory:, sqlite:PATH, postgres://…, mysql://…, redis://… or dynamodb://TABLE", scheme, redact.URL(raw))
}

// Options tune the opened store.
type Options struct {
	// Limits bound what the store accepts.
	Limits store.Limits
	// SkipMigrate opens a SQL store without migrating its schema.
	SkipMigrate bool
	// Concurrency is how many goroutines will call the store at once; a
	// PostgreSQL store whose URL does not set pool_max_conns gets a pool of
	// that many connections (0: pgstore's default).
	Concurrency int
}

// Open parses raw and opens the store it names. The caller closes it.
func Open(ctx context.Context, raw string, opts *Options) (store.Store, error) {
	spec, err := Parse(raw)
	if err != nil {
		return nil, err
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	switch spec.Kind {
	case Memory:
		return memstore.New(memstore.Config{Limits: o.Limits}), nil
	case SQLite:
		noCoalesce, err := parseCoalesce(spec.Query.Get("idem_coalesce"))
		if err != nil {
			return nil, err
		}
		return sqlitestore.Open(ctx, sqlitestore.Config{Path: spec.Path, Synchronous: spec.Query.Get("synchronous"), Limits: o.Limits,
			SkipMigrate: o.SkipMigrate, NoCoalesce: noCoalesce})
	}
	opener, ok := openers[spec.Kind]
	if !ok {
		return nil, fmt.Errorf("idem: store URL %q: the %s store is not built into this program", raw, spec.Kind)
	}
	st, err := opener(ctx, spec, o)
	if err != nil {
		return nil, err // not an interface holding a backend's nil pointer
	}
	return st, nil
}

// openers holds the backends with a server, registered by their own files so
// each is one place to read.
var openers = map[Kind]func(context.Context, Spec, Options) (store.Store, error){}

// parseCoalesce reads the idem_coalesce option of a store URL: "" or 1 (the
// default: calls that wait for the store together share a round trip), 0
// (every call alone). It returns the stores' NoCoalesce.
func parseCoalesce(v string) (bool, error) {
	switch v {
	case "", "1", "true":
		return false, nil
	case "0", "false":
		return true, nil
	}
	return false, fmt.Errorf("idem: store URL: idem_coalesce is %q, want 1 or 0", v)
}
