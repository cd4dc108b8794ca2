package storeurl

import (
	"context"
	"fmt"
	"net/url"

	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/pgstore"
)

// PostgreSQL URLs are pgx connection strings (pool_max_conns and the other
// pgxpool settings work; without pool_max_conns the pool fits
// Options.Concurrency, else pgstore's default) plus idem's own options,
// removed before the URL is handed to pgx:
//
//	idem_schema=NAME     the schema holding idem's tables (default: search_path)
//	idem_pgbouncer=1     no named prepared statements (PgBouncer transaction mode)
//	idem_coalesce=0      every call its own statement (default 1: calls that
//	                     wait for the store together share one; pgstore.Config.NoCoalesce)
//
// Any other parameter is pgx's: a server setting such as synchronous_commit
// is sent as the sessions' own (the store commits synchronously unless the
// URL sets synchronous_commit; pgstore.Config.ConnString).
func init() {
	openers[Postgres] = func(ctx context.Context, spec Spec, o Options) (store.Store, error) {
		u, err := url.Parse(spec.Raw)
		if err != nil {
			return nil, fmt.Errorf("idem: store URL: %v", err)
		}
		q := u.Query()
		cfg := pgstore.Config{Schema: q.Get("idem_schema"), Limits: o.Limits, SkipMigrate: o.SkipMigrate, MaxConns: int32(o.Concurrency)}
		switch q.Get("idem_pgbouncer") {
		case "", "0", "false":
		case "1", "true":
			cfg.PgBouncer = true
		default:
			return nil, fmt.Errorf("idem: store URL: idem_pgbouncer is %q, want 1 or 0", q.Get("idem_pgbouncer"))
		}
		if cfg.NoCoalesce, err = parseCoalesce(q.Get("idem_coalesce")); err != nil {
			return nil, err
		}
		q.Del("idem_schema")
		q.Del("idem_pgbouncer")
		q.Del("idem_coalesce")
		u.RawQuery = q.Encode()
		cfg.ConnString = u.String()
		return pgstore.Open(ctx, cfg)
	}
}
