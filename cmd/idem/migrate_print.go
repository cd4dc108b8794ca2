package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"

	"github.com/idemgo/idem/internal/sqlmigrate"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/store/mysqlstore"
	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/sqlitestore"
	"github.com/idemgo/idem/store/storeurl"
)

// printMigrations writes the SQL that idem migrate applies to the store at
// raw, as sqlmigrate.Script renders it, without connecting to it.
func printMigrations(ctx context.Context, w io.Writer, raw string) error {
	spec, err := storeurl.Parse(raw)
	if err != nil {
		return err
	}
	var script string
	switch spec.Kind {
	case storeurl.SQLite:
		db, err := sql.Open("sqlite", spec.Path) // never used: no file is created
		if err != nil {
			return err
		}
		defer db.Close()
		ob, err := outbox.New(databasesql.New(db, sqldriver.SQLite), outbox.Config{})
		if err != nil {
			return err
		}
		script = sqlmigrate.Script(sqldriver.SQLite, "",
			sqlmigrate.Component{Name: "records", Steps: sqlitestore.Migrations()},
			sqlmigrate.Component{Name: "outbox", Steps: ob.Store.Migrations()})
	case storeurl.Postgres:
		s, err := storeurl.Open(ctx, raw, &storeurl.Options{SkipMigrate: true}) // a pool that connects on first use
		if err != nil {
			return err
		}
		defer s.Close()
		ob, closeOutbox, err := openOutbox(ctx, raw)
		if err != nil {
			return err
		}
		defer closeOutbox()
		pg := s.(*pgstore.Store)
		script = sqlmigrate.Script(sqldriver.Postgres, pg.Schema(),
			sqlmigrate.Component{Name: "records", Steps: pg.Migrations()},
			sqlmigrate.Component{Name: "outbox", Steps: ob.Migrations()})
	case storeurl.MySQL:
		ob, err := outbox.New(databasesql.New(nil, sqldriver.MySQL), outbox.Config{}) // for its SQL: never connects
		if err != nil {
			return err
		}
		script = sqlmigrate.Script(sqldriver.MySQL, "",
			sqlmigrate.Component{Name: "records", Steps: mysqlstore.Migrations()},
			sqlmigrate.Component{Name: "outbox", Steps: ob.Store.Migrations()})
	case storeurl.DynamoDB:
		return fmt.Errorf("%s: DynamoDB has no SQL: idem migrate creates the table (on-demand capacity, the partition key k, a string, TTL on ttl)", raw)
	default:
		return fmt.Errorf("%s has no schema to print", raw)
	}
	_, err = fmt.Fprintf(w, "-- What idem migrate applies to an empty database: run it in order, or only the\n"+
		"-- steps whose (component, version) idem_migrations does not hold yet (idem migrate --status).\n%s", script)
	return err
}
