package outbox

import (
	"context"
	"fmt"

	"github.com/idemgo/idem/sqldriver"
)

// The outbox on MySQL and MariaDB (sqldriver.MySQL). It keeps the same rows
// and states as on PostgreSQL; what differs is how they are written:
//
//   - Strings that are compared (the key, ordering and external ids, the
//     claim token) are binary strings: compared byte for byte, whatever
//     the server's collation.
//   - InnoDB has no partial indexes: the due index leads with the status.
//   - MySQL 8 has no RETURNING: a claim is a locking SELECT of the due rows
//     (SKIP LOCKED) and an UPDATE of them by id, in one transaction; a
//     counter's increment is read back in its transaction.
//   - An UPDATE by ids names the primary key (FORCE INDEX): InnoDB reads a
//     small table whole otherwise, locking every row it reads — another
//     relay's claimed rows among them.
//   - A statement that may change nothing it matched (an ack of an acked
//     row) is checked by a read when it reports no row: how many rows an
//     UPDATE reports depends on the connection's CLIENT_FOUND_ROWS.

// mysqlSchema is Schema on MySQL.
func (s *Store) mysqlSchema() string {
	return `CREATE TABLE IF NOT EXISTS ` + s.t("idem_outbox") + ` (
	id              bigint AUTO_INCREMENT PRIMARY KEY,
	` + "`key`" + `           varbinary(255) NOT NULL,
	destination     varbinary(2048) NOT NULL,
	payload         longblob NOT NULL,
	headers         mediumtext NOT NULL,
	status          varchar(8) NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'acked', 'dead', 'skipped')),
	tries           integer NOT NULL DEFAULT 0,
	last_error      varbinary(2048) NOT NULL DEFAULT '',
	next_attempt_at datetime(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
	created_at      datetime(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
	sent_at         datetime(6) NULL,
	acked_at        datetime(6) NULL,
	claimed_by      varbinary(64) NULL,
	claimed_until   datetime(6) NULL,
	external_id     varbinary(255) NULL,
	ordering_key    varbinary(255) NULL,
	trace_context   text NULL,
	UNIQUE KEY idem_outbox_key (` + "`key`" + `),
	KEY idem_outbox_due (status, next_attempt_at, id),
	KEY idem_outbox_external_id (external_id),
	KEY idem_outbox_ordering (ordering_key, status, id),
	KEY idem_outbox_claimed (ordering_key, claimed_until) -- a key's claimed rows: no partial indexes in InnoDB
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS ` + s.t("idem_outbox_counters") + ` (
	name  varbinary(255) NOT NULL PRIMARY KEY,
	value bigint NOT NULL
) ENGINE=InnoDB;`
}

// mysqlQueries replaces the statements MySQL does not take (see above).
// cols are a Row's columns of the table as o.
func (s *Store) mysqlQueries(cols string) {
	tbl := s.t("idem_outbox")
	byID := `UPDATE ` + tbl + ` FORCE INDEX (PRIMARY) SET `
	insert := `INSERT IGNORE INTO ` + tbl + " (`key`, destination, payload, headers, external_id, ordering_key, trace_context) VALUES ($1, $2, $3, $4, NULLIF($5, ''), NULLIF($6, ''), NULLIF($7, ''))"
	s.q.insert, s.q.insertAlone = insert, insert
	s.q.existing = `SELECT destination, payload FROM ` + tbl + " WHERE `key` = $1"
	s.q.counter = `INSERT INTO ` + s.t("idem_outbox_counters") + ` (name, value) VALUES ($1, 1) ON DUPLICATE KEY UPDATE value = value + 1`
	s.q.counterRead = `SELECT value FROM ` + s.t("idem_outbox_counters") + ` WHERE name = $1`
	claim := func(pastDead bool) string {
		unfinished := `'pending', 'dead'`
		if pastDead {
			unfinished = `'pending'`
		}
		return `SELECT o.id, o.` + "`key`" + `, o.destination, o.payload, o.headers, coalesce(o.external_id, ''), coalesce(o.ordering_key, ''), coalesce(o.trace_context, ''), o.tries
FROM ` + tbl + ` o WHERE o.status = 'pending' AND o.next_attempt_at <= UTC_TIMESTAMP(6)
	AND (o.claimed_until IS NULL OR o.claimed_until < UTC_TIMESTAMP(6))
	AND (o.ordering_key IS NULL OR o.id <= (SELECT min(e.id) FROM ` + tbl + ` e
		WHERE e.ordering_key = o.ordering_key AND e.status IN (` + unfinished + `)))
	ORDER BY o.next_attempt_at, o.id LIMIT $1 FOR UPDATE SKIP LOCKED`
	}
	s.q.claim, s.q.claimPastDead = claim(false), claim(true)
	s.q.claimMark = byID + `claimed_by = $1, claimed_until = ` + s.d.NowPlusMillis("$2") + ` WHERE `
	s.q.sent = byID + `status = $2, tries = tries + 1, last_error = '', sent_at = UTC_TIMESTAMP(6),
	acked_at = CASE WHEN $2 = 'acked' THEN UTC_TIMESTAMP(6) ELSE acked_at END, claimed_by = NULL, claimed_until = NULL
WHERE claimed_by = $1 AND status = 'pending' AND `
	s.q.extend = byID + `claimed_until = ` + s.d.NowPlusMillis("$2") + ` WHERE claimed_by = $1 AND `
	s.q.unclaim = byID + `claimed_by = NULL, claimed_until = NULL WHERE claimed_by = $1 AND `
	s.q.failed = byID + `status = $5, tries = tries + 1, last_error = $3,
	next_attempt_at = ` + s.d.NowPlusMillis("$4") + `, claimed_by = NULL, claimed_until = NULL
WHERE claimed_by = $1 AND id = $2 AND status = 'pending'`
	s.q.ack = `UPDATE ` + tbl + " SET status = 'acked', acked_at = UTC_TIMESTAMP(6) WHERE `key` = $1 AND status IN ('pending', 'sent', 'acked')"
	s.q.ackSent = `UPDATE ` + tbl + " SET status = 'acked', acked_at = coalesce(acked_at, UTC_TIMESTAMP(6)) WHERE `key` = $1 AND status IN ('sent', 'acked')"
	s.q.acked = `SELECT count(*) FROM ` + tbl + " WHERE `key` = $1 AND status = 'acked'"
	s.q.retry = `UPDATE ` + tbl + " SET status = 'pending', next_attempt_at = UTC_TIMESTAMP(6), claimed_by = NULL, claimed_until = NULL WHERE `key` = $1 AND status = 'dead'"
	s.q.skip = `UPDATE ` + tbl + " SET status = 'skipped' WHERE `key` = $1 AND status = 'dead'"
	s.q.refuse = `UPDATE ` + tbl + " SET status = $3, last_error = $2, next_attempt_at = UTC_TIMESTAMP(6), claimed_by = NULL, claimed_until = NULL WHERE `key` = $1 AND status = 'sent'"
	s.q.purge = `DELETE FROM ` + tbl + ` WHERE status IN ('sent', 'acked') AND coalesce(acked_at, sent_at) < ` + s.d.NowPlusMillis("-$1") + ` ORDER BY id LIMIT $2`
	s.q.get = `SELECT ` + cols + ` FROM ` + tbl + " o WHERE o.`key` = $1"
}

// claimMySQL is claim on MySQL: the due rows read with their locks
// (skipping rows another relay holds), then marked claimed, in one
// transaction.
func (s *Store) claimMySQL(ctx context.Context, q, token string, lease int64, n int) ([]claimed, error) {
	var out []claimed
	err := s.inTx(ctx, func(tx sqldriver.Executor) error {
		out = out[:0]
		rs, err := tx.Query(ctx, q, n)
		if err != nil {
			return err
		}
		if out, err = scanClaimed(rs, out); err != nil || len(out) == 0 {
			return err
		}
		ids := make([]int64, len(out))
		for i, c := range out {
			ids[i] = c.ID
		}
		mark, args := s.withIDs(s.q.claimMark, []any{token, lease}, ids)
		_, err = tx.Exec(ctx, mark, args...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("idem/outbox: claim: %w", err)
	}
	return out, nil
}

// changedOrAcked is n (rows an ack reported) or, where MySQL reported none,
// whether key's row is acked: an ack of an acked row changes nothing, and a
// connection without CLIENT_FOUND_ROWS counts it as no row.
func (s *Store) changedOrAcked(ctx context.Context, n int64, key string) (int64, error) {
	if n > 0 || s.d != sqldriver.MySQL {
		return n, nil
	}
	err := s.db.QueryRow(ctx, s.q.acked, key).Scan(&n)
	return n, err
}
