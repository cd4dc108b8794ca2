package databasesql_test

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/sqldriver"
	"github.com/idemgo/idem/sqldriver/databasesql"
	"github.com/idemgo/idem/sqldriver/drivertest"
)

func TestPostgres(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) (sqldriver.Driver[*sql.Tx], string) {
		testenv.ProbePostgres(t)
		db, err := sql.Open("pgx", testenv.PostgresURL)
		if err != nil {
			t.Fatal(err)
		}
		schema := testenv.RandomName("idemdriver_")
		if _, err := db.ExecContext(context.Background(), `CREATE SCHEMA `+schema); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
			db.Close()
		})
		return databasesql.New(db, sqldriver.Postgres), schema
	})
}

func TestSQLite(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) (sqldriver.Driver[*sql.Tx], string) {
		path := filepath.Join(t.TempDir(), "driver.db")
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return databasesql.New(db, sqldriver.SQLite), ""
	})
}

func TestMySQL(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) (sqldriver.Driver[*sql.Tx], string) {
		loc := testenv.MySQLDatabase(t, "")
		db := testenv.OpenMySQL(t, loc)
		u, _ := url.Parse(loc)
		return databasesql.New(db, sqldriver.MySQL), strings.TrimPrefix(u.Path, "/")
	})
}
