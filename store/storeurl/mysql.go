package storeurl

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/idemgo/idem/internal/redact"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/mysqlstore"
)

// MySQL and MariaDB URLs name the server and the database:
//
//	mysql://USER:PASSWORD@HOST[:PORT]/DATABASE[?OPTIONS]
//
// (mariadb:// is the same). The options are go-sql-driver/mysql's own
// (tls=true, tls=skip-verify, timeout=5s, readTimeout=…, …) plus idem's,
// removed before the rest is handed to the driver:
//
//	idem_coalesce=0      every call its own round trip (default 1: calls that
//	                     wait for the store together share one; mysqlstore.Config.NoCoalesce)
//
// The password is never shown: messages name the URL with it redacted.
func parseMySQL(raw, rest string) (Spec, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Spec{}, fmt.Errorf("idem: store URL %q: %v", redact.URL(raw), redact.ParseError(err))
	}
	if !strings.HasPrefix(rest, "//") || u.Host == "" {
		return Spec{}, fmt.Errorf("idem: store URL %q: want mysql://USER:PASSWORD@HOST[:PORT]/DATABASE", u.Redacted())
	}
	if db := strings.Trim(u.Path, "/"); db == "" || strings.Contains(db, "/") {
		return Spec{}, fmt.Errorf("idem: store URL %q names no database: want mysql://USER:PASSWORD@HOST[:PORT]/DATABASE", u.Redacted())
	}
	return Spec{Kind: MySQL, Path: strings.Trim(u.Path, "/"), Query: u.Query(), Raw: raw}, nil
}

func init() {
	openers[MySQL] = func(ctx context.Context, spec Spec, o Options) (store.Store, error) {
		u, err := url.Parse(spec.Raw)
		if err != nil {
			return nil, fmt.Errorf("idem: store URL: %v", redact.ParseError(err))
		}
		u.Scheme = "mysql"
		q := u.Query()
		noCoalesce, err := parseCoalesce(q.Get("idem_coalesce"))
		if err != nil {
			return nil, err
		}
		q.Del("idem_coalesce")
		u.RawQuery = q.Encode()
		return mysqlstore.Open(ctx, mysqlstore.Config{DSN: u.String(), Limits: o.Limits, SkipMigrate: o.SkipMigrate,
			MaxConns: o.Concurrency, NoCoalesce: noCoalesce})
	}
}
