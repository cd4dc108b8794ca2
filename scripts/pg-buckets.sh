#!/usr/bin/env bash
# Measures what issue 16 asks of PostgreSQL — at most 120 bytes per completed
# record, and lifecycles within 10% of today's encoding — for the one layout
# that gets under 120 bytes: many records to a row (a bucket), as idem does on
# Redis. A row costs ~28 bytes of header and line pointer and its key an index
# entry of ~40, so a row per record cannot reach 120 (README, backend section);
# a bucket row pays them once for many records.
#
# The layout measured (schema idem_bucket_exp, dropped at the end):
#   b int4 PRIMARY KEY (the bucket: a hash of the key), and one array per
#   field: ks uuid[] (compact keys), meta int8[] (state, attempts, expiry ms),
#   fences int8[], fps uuid[] (fingerprint digests), rs bytea[] (the result;
#   an in-flight record's lease end), fillfactor 85, stored inline.
# A transition is one call of a PL/pgSQL function (one round trip) that locks
# the bucket row, finds the key with array_position and writes the row back;
# a batch (as coalescing sends) is one call looping over its keys in bucket
# order. It decides acquire and complete as pgstore does for a new key; it is
# an experiment, not a store: no migration, sweep or mixed encodings.
#
# Prints, in one run:
#   - bytes per completed record (28-byte result) at 1,000,000 records loaded
#     in bulk, with 24 and with 8 records a bucket (pg_total_relation_size);
#   - pgbench lifecycles/s at CONCURRENCY clients, one key a transaction:
#     today's statements against the bucket functions (8 a bucket);
#   - pgbench with 16 keys a transaction at 8 clients (what coalescing sends):
#     today's batch statements against the bucket functions;
#   - the floor of a row per record: bytes per record of the smallest row
#     that holds one, inserted once, with each index that can keep keys
#     unique (see floor below);
#   - a row per record that never updates a settled record (see split
#     below): bytes per record at 1,000,000 loaded in bulk, and lifecycles/s
#     one key and 16 keys a transaction beside today's statements.
#
# Usage: scripts/pg-buckets.sh [SECONDS] [CONCURRENCY]   (defaults: 10 32)
# Needs pgbench, psql and python3; PostgreSQL 13 or later (gen_random_uuid).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conc=${2:-32}
pg_url=${IDEM_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; psql "$pg_url" -qc "SET client_min_messages = warning; DROP SCHEMA IF EXISTS idem_bucket_exp CASCADE; DROP SCHEMA IF EXISTS idem_bench CASCADE" >/dev/null 2>&1 || true' EXIT
ncpu=$(nproc)

go build -o "$tmp/idem" ./cmd/idem
(cd scripts && go run ./benchscripts pgbench idem_bench) >"$tmp/today.sql"
(cd scripts && go run ./benchscripts pgbench-batch idem_bench) >"$tmp/today16.sql"

psql "$pg_url" -q -v ON_ERROR_STOP=1 <<'SQL'
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS idem_bucket_exp CASCADE;
CREATE SCHEMA idem_bucket_exp;
SET search_path = idem_bucket_exp;
-- meta: state << 60 | attempts << 48 | expires at (ms)
CREATE TABLE b (b int4 PRIMARY KEY, ks uuid[] NOT NULL, meta int8[] NOT NULL, fences int8[] NOT NULL,
	fps uuid[] NOT NULL, rs bytea[] NOT NULL) WITH (fillfactor = 85, toast_tuple_target = 8160);
ALTER TABLE b ALTER ks SET STORAGE MAIN, ALTER meta SET STORAGE MAIN, ALTER fences SET STORAGE MAIN,
	ALTER fps SET STORAGE MAIN, ALTER rs SET STORAGE MAIN;
CREATE FUNCTION now_ms() RETURNS int8 LANGUAGE sql STABLE AS $$ SELECT (extract(epoch from now()) * 1000)::int8 $$;

CREATE FUNCTION acquire(p_b int4, p_k uuid, p_fp uuid, p_lease int8, p_keep int8, OUT outcome int, OUT fence int8)
LANGUAGE plpgsql AS $$
DECLARE
	r idem_bucket_exp.b%ROWTYPE; i int; m int8; st int; a int; e int8;
	now_ms int8 := idem_bucket_exp.now_ms();
	floor int8 := (extract(epoch from clock_timestamp()) * 1000000)::int8;
BEGIN
	SELECT * INTO r FROM idem_bucket_exp.b WHERE idem_bucket_exp.b.b = p_b FOR UPDATE;
	IF NOT FOUND THEN
		INSERT INTO idem_bucket_exp.b VALUES (p_b, '{}', '{}', '{}', '{}', '{}') ON CONFLICT DO NOTHING;
		SELECT * INTO r FROM idem_bucket_exp.b WHERE idem_bucket_exp.b.b = p_b FOR UPDATE;
	END IF;
	i := array_position(r.ks, p_k);
	IF i IS NULL THEN
		i := coalesce(array_length(r.ks, 1), 0) + 1;
		r.ks[i] := p_k; r.fps[i] := p_fp; st := 1; a := 1; e := now_ms + p_keep; fence := floor; outcome := 1;
	ELSE
		m := r.meta[i]; st := (m >> 60)::int; a := ((m >> 48) & 4095)::int; e := m & ((1::int8 << 48) - 1);
		IF e <= now_ms THEN
			st := 1; a := 1; e := now_ms + p_keep; r.fps[i] := p_fp; outcome := 1;
		ELSIF r.fps[i] <> p_fp THEN outcome := 5; fence := r.fences[i]; RETURN;
		ELSIF st = 1 AND ('x' || encode(r.rs[i], 'hex'))::bit(64)::int8 > now_ms THEN outcome := 3; fence := r.fences[i]; RETURN;
		ELSIF st IN (2, 3) THEN outcome := 4; fence := r.fences[i]; RETURN;
		ELSIF st = 4 THEN outcome := 6; fence := r.fences[i]; RETURN;
		ELSE
			outcome := CASE WHEN st = 1 THEN 2 ELSE 1 END;
			st := 1; a := a + 1; e := greatest(e, now_ms + p_keep);
		END IF;
		fence := greatest(r.fences[i] + 1, floor);
	END IF;
	r.meta[i] := (st::int8 << 60) | (a::int8 << 48) | e; r.fences[i] := fence; r.rs[i] := int8send(now_ms + p_lease);
	UPDATE idem_bucket_exp.b SET ks = r.ks, meta = r.meta, fences = r.fences, fps = r.fps, rs = r.rs WHERE idem_bucket_exp.b.b = p_b;
END $$;

CREATE FUNCTION complete(p_b int4, p_k uuid, p_fence int8, p_result bytea, p_keep int8) RETURNS bool
LANGUAGE plpgsql AS $$
DECLARE r idem_bucket_exp.b%ROWTYPE; i int; m int8; now_ms int8 := idem_bucket_exp.now_ms();
BEGIN
	SELECT * INTO r FROM idem_bucket_exp.b WHERE idem_bucket_exp.b.b = p_b FOR UPDATE;
	IF NOT FOUND THEN RETURN false; END IF;
	i := array_position(r.ks, p_k);
	IF i IS NULL OR r.fences[i] <> p_fence THEN RETURN false; END IF;
	m := r.meta[i];
	IF (m >> 60) <> 1 OR (m & ((1::int8 << 48) - 1)) <= now_ms THEN RETURN false; END IF;
	r.meta[i] := (2::int8 << 60) | (m & (4095::int8 << 48)) | (now_ms + p_keep);
	r.rs[i] := p_result;
	UPDATE idem_bucket_exp.b SET meta = r.meta, rs = r.rs WHERE idem_bucket_exp.b.b = p_b;
	RETURN true;
END $$;

-- A batch: its calls in bucket order (so that batches lock rows in one order).
CREATE FUNCTION acquire_many(p_b int4[], p_k uuid[], p_fp uuid[], p_lease int8, p_keep int8) RETURNS TABLE (k uuid, outcome int, fence int8)
LANGUAGE plpgsql AS $$
DECLARE j int8;
BEGIN
	FOR j IN SELECT o FROM unnest(p_b) WITH ORDINALITY AS u(b, o) ORDER BY u.b LOOP
		k := p_k[j];
		SELECT a.outcome, a.fence INTO outcome, fence FROM idem_bucket_exp.acquire(p_b[j], p_k[j], p_fp[j], p_lease, p_keep) a;
		RETURN NEXT;
	END LOOP;
END $$;
CREATE FUNCTION complete_many(p_b int4[], p_k uuid[], p_f int8[], p_r bytea[], p_keep int8) RETURNS TABLE (k uuid, ok bool)
LANGUAGE plpgsql AS $$
DECLARE j int8;
BEGIN
	FOR j IN SELECT o FROM unnest(p_b) WITH ORDINALITY AS u(b, o) ORDER BY u.b LOOP
		k := p_k[j];
		ok := idem_bucket_exp.complete(p_b[j], p_k[j], p_f[j], p_r[j], p_keep);
		RETURN NEXT;
	END LOOP;
END $$;
SQL

# load PER_BUCKET: 1,000,000 completed records (28-byte results) in bulk;
# prints bytes per record.
load() {
	local buckets=$((1000000 / $1))
	psql "$pg_url" -qAt -v ON_ERROR_STOP=1 <<SQL
SET search_path = idem_bucket_exp;
TRUNCATE b;
INSERT INTO b SELECT x.b, array_agg(k), array_agg((2::int8 << 60) | (1::int8 << 48) | (now_ms() + 3600000)), array_agg(f), array_agg(fp), array_agg(r)
FROM (SELECT gen_random_uuid() k, (random() * ($buckets - 1))::int4 b, i::int8 f, gen_random_uuid() fp, decode(substr(md5(random()::text) || md5(random()::text), 1, 56), 'hex') r
	FROM generate_series(1, 1000000) i) x GROUP BY x.b;
VACUUM ANALYZE b;
SELECT round(pg_total_relation_size('b') / 1000000.0, 1);
SQL
}
bytes24=$(load 24)
bytes8=$(load 8)

# The floor of a row per record: 1,000,000 rows inserted once (no update, no
# dead row versions, fillfactor 100) of the smallest row that holds a
# completed record — the key (16 bytes) and one value of 60 bytes (state,
# attempts, a 4-byte fence offset, a 6-byte expiry, a 4-byte age, the
# fingerprint digest's 16 bytes, the 28-byte result: what a Redis bucket
# keeps) — with each index that can keep a key unique: a unique B-tree on the
# key; a hash index (an exclusion constraint; no ON CONFLICT DO UPDATE); a
# non-unique B-tree on a bucket of the key (8 rows a bucket, deduplicated),
# uniqueness left to advisory locks. Prints bytes per record for each.
floor() { # INDEX-DDL (on table f)
	psql "$pg_url" -qAt -v ON_ERROR_STOP=1 <<SQL
SET client_min_messages = warning;
SET search_path = idem_bucket_exp;
DROP TABLE IF EXISTS f;
CREATE FUNCTION fb(k bytea) RETURNS int4 IMMUTABLE LANGUAGE sql AS \$\$ SELECT (get_byte(k, 0) * 65536 + get_byte(k, 1) * 256 + get_byte(k, 2)) % 131072 \$\$;
CREATE TABLE f (k bytea NOT NULL, v bytea NOT NULL) WITH (fillfactor = 100);
ALTER TABLE f ALTER k SET STORAGE PLAIN, ALTER v SET STORAGE PLAIN;
$1;
INSERT INTO f SELECT uuid_send(gen_random_uuid()), decode(md5(random()::text) || md5(random()::text) || md5(random()::text), 'hex') || decode(substr(md5(random()::text), 1, 24), 'hex')
FROM generate_series(1, 1000000);
VACUUM ANALYZE f;
SELECT round(pg_total_relation_size('f') / 1000000.0, 1);
DROP TABLE f; DROP FUNCTION fb;
SQL
}
floor_btree=$(floor 'CREATE UNIQUE INDEX ON f (k)')
floor_hash=$(floor 'ALTER TABLE f ADD EXCLUDE USING hash (k WITH =)')
floor_bucket=$(floor 'CREATE INDEX ON f (fb(k))')
buckets=$((1000000 / 8))

cat >"$tmp/bucket.sql" <<SQL
\set n random(1, 1000000000000)
\set b random(0, $((buckets - 1)))
SELECT fence FROM idem_bucket_exp.acquire(:b, md5(:n::text)::uuid, '00000000-0000-0000-0000-000000000001', 60000, 3600000) \gset
SELECT idem_bucket_exp.complete(:b, md5(:n::text)::uuid, :fence, convert_to('{"status":"ok"}', 'UTF8'), 3600000);
SQL
keys='ARRAY(SELECT md5((:n::int8 * 100 + g)::text)::uuid FROM generate_series(1, 16) g ORDER BY 1)'
bks="ARRAY(SELECT (abs(hashtext(md5((:n::int8 * 100 + g)::text))) % $buckets)::int4 FROM generate_series(1, 16) g ORDER BY md5((:n::int8 * 100 + g)::text)::uuid)"
cat >"$tmp/bucket16.sql" <<SQL
\set n random(1, 10000000000)
SELECT array_agg(a.fence ORDER BY a.k)::text AS fences FROM idem_bucket_exp.acquire_many($bks, $keys, array_fill('00000000-0000-0000-0000-000000000001'::uuid, ARRAY[16]), 60000, 3600000) a \gset
SELECT count(*) FROM idem_bucket_exp.complete_many($bks, $keys, :fences::int8[], array_fill(convert_to('{"status":"ok"}', 'UTF8'), ARRAY[16]), 3600000);
SQL

# A row per record that gets under 120 bytes (split): settled records in a
# table of their own, inserted once and never updated (a 16-byte key and one
# 60-byte value: meta I8 = state << 60 | attempts << 48 | expiry ms, fence I8,
# the fingerprint digest, the result), indexed only by a bucket of the key
# (32 records a bucket at 1,000,000: a deduplicated B-tree of ~10 bytes a
# record); claims in a small table of their own with a unique key. A key's
# transitions are serialized by an advisory lock on it (no unique index can
# keep it in one of the two tables): acquire looks at the claims, then at
# the bucket's records (each statement sees what committed before it, and a
# settle moves a record from one table to the other in one transaction), and
# inserts a claim; complete deletes the claim its fence holds and inserts the
# settled record. One PL/pgSQL call (one round trip) a transition.
psql "$pg_url" -q -v ON_ERROR_STOP=1 <<'SQL'
SET client_min_messages = warning;
SET search_path = idem_bucket_exp;
CREATE FUNCTION sb(k bytea) RETURNS int4 IMMUTABLE PARALLEL SAFE LANGUAGE sql AS $$ SELECT (get_byte(k, 1) * 65536 + get_byte(k, 2) * 256 + get_byte(k, 3)) % 31250 $$;
CREATE TABLE sr (k bytea NOT NULL, v bytea NOT NULL) WITH (fillfactor = 100);
ALTER TABLE sr ALTER k SET STORAGE PLAIN, ALTER v SET STORAGE PLAIN;
CREATE INDEX ON sr (sb(k));
CREATE TABLE sc (k bytea PRIMARY KEY, fence int8 NOT NULL, fp bytea NOT NULL, attempts int2 NOT NULL, lease_until int8 NOT NULL, expires int8 NOT NULL);

CREATE FUNCTION split_acquire(p_k bytea, p_fp bytea, p_lease int8, p_keep int8, OUT outcome int, OUT fence int8)
LANGUAGE plpgsql AS $$
DECLARE
	c idem_bucket_exp.sc%ROWTYPE; v bytea; m int8; st int; a int := 1; e int8;
	t int8 := idem_bucket_exp.now_ms();
	floor int8 := (extract(epoch from clock_timestamp()) * 1000000)::int8;
BEGIN
	PERFORM pg_advisory_xact_lock(hashtextextended(encode(p_k, 'hex'), 16));
	SELECT * INTO c FROM idem_bucket_exp.sc WHERE sc.k = p_k;
	IF FOUND THEN
		IF c.fp <> p_fp THEN outcome := 5; fence := c.fence; RETURN; END IF;
		IF c.lease_until > t THEN outcome := 3; fence := c.fence; RETURN; END IF;
		fence := greatest(c.fence + 1, floor);
		UPDATE idem_bucket_exp.sc SET fence = split_acquire.fence, attempts = c.attempts + 1, lease_until = t + p_lease WHERE sc.k = p_k;
		outcome := 2; RETURN;
	END IF;
	SELECT sr.v INTO v FROM idem_bucket_exp.sr WHERE idem_bucket_exp.sb(sr.k) = idem_bucket_exp.sb(p_k) AND sr.k = p_k;
	IF FOUND THEN
		m := ('x' || encode(substr(v, 1, 8), 'hex'))::bit(64)::int8; st := (m >> 60)::int; e := m & ((1::int8 << 48) - 1);
		IF e > t THEN
			IF substr(v, 17, 16) <> p_fp THEN outcome := 5; fence := ('x' || encode(substr(v, 9, 8), 'hex'))::bit(64)::int8; RETURN; END IF;
			IF st IN (2, 3, 4) THEN outcome := CASE WHEN st = 4 THEN 6 ELSE 4 END; fence := ('x' || encode(substr(v, 9, 8), 'hex'))::bit(64)::int8; RETURN; END IF;
			a := ((m >> 48) & 4095)::int + 1;
		END IF;
		DELETE FROM idem_bucket_exp.sr WHERE idem_bucket_exp.sb(sr.k) = idem_bucket_exp.sb(p_k) AND sr.k = p_k;
	END IF;
	fence := floor;
	INSERT INTO idem_bucket_exp.sc VALUES (p_k, floor, p_fp, a, t + p_lease, t + p_keep);
	outcome := 1;
END $$;

CREATE FUNCTION split_complete(p_k bytea, p_fence int8, p_result bytea, p_keep int8) RETURNS bool
LANGUAGE plpgsql AS $$
DECLARE c idem_bucket_exp.sc%ROWTYPE; t int8 := idem_bucket_exp.now_ms();
BEGIN
	DELETE FROM idem_bucket_exp.sc WHERE sc.k = p_k AND sc.fence = p_fence AND sc.expires > t RETURNING * INTO c;
	IF NOT FOUND THEN RETURN false; END IF;
	INSERT INTO idem_bucket_exp.sr VALUES (p_k, int8send((2::int8 << 60) | (c.attempts::int8 << 48) | (t + p_keep)) || int8send(p_fence) || c.fp || p_result);
	RETURN true;
END $$;

-- A batch: its calls in key order (so that batches take the keys' locks in one order).
CREATE FUNCTION split_acquire_many(p_k bytea[], p_fp bytea[], p_lease int8, p_keep int8, OUT k bytea, OUT outcome int, OUT fence int8) RETURNS SETOF record
LANGUAGE plpgsql AS $$
DECLARE j int8;
BEGIN
	FOR j IN SELECT o FROM unnest(p_k) WITH ORDINALITY AS u(kk, o) ORDER BY u.kk LOOP
		k := p_k[j];
		SELECT a.outcome, a.fence INTO outcome, fence FROM idem_bucket_exp.split_acquire(p_k[j], p_fp[j], p_lease, p_keep) a;
		RETURN NEXT;
	END LOOP;
END $$;
CREATE FUNCTION split_complete_many(p_k bytea[], p_f int8[], p_r bytea[], p_keep int8, OUT k bytea, OUT ok bool) RETURNS SETOF record
LANGUAGE plpgsql AS $$
DECLARE j int8;
BEGIN
	FOR j IN SELECT o FROM unnest(p_k) WITH ORDINALITY AS u(kk, o) ORDER BY u.kk LOOP
		k := p_k[j];
		ok := idem_bucket_exp.split_complete(p_k[j], p_f[j], p_r[j], p_keep);
		RETURN NEXT;
	END LOOP;
END $$;

INSERT INTO sr SELECT uuid_send(gen_random_uuid()), int8send((2::int8 << 60) | (1::int8 << 48) | (now_ms() + 3600000)) || int8send(i) || decode(md5(random()::text), 'hex') || decode(substr(md5(random()::text) || md5(random()::text), 1, 56), 'hex')
FROM generate_series(1, 1000000) i;
VACUUM ANALYZE sr;
SQL
split_bytes=$(psql "$pg_url" -qAt -c "SELECT round(pg_total_relation_size('idem_bucket_exp.sr') / 1000000.0, 1)")
cat >"$tmp/split.sql" <<'SQL'
\set n random(1, 1000000000000)
SELECT fence FROM idem_bucket_exp.split_acquire(uuid_send(md5(:n::text)::uuid), '\x00000000000000000000000000000001'::bytea, 60000, 3600000) \gset
SELECT idem_bucket_exp.split_complete(uuid_send(md5(:n::text)::uuid), :fence, convert_to('{"status":"ok"}', 'UTF8'), 3600000);
SQL
skeys='ARRAY(SELECT uuid_send(md5((:n::int8 * 100 + g)::text)::uuid) FROM generate_series(1, 16) g ORDER BY 1)'
cat >"$tmp/split16.sql" <<SQL
\\set n random(1, 10000000000)
SELECT array_agg(a.fence ORDER BY a.k)::text AS fences FROM idem_bucket_exp.split_acquire_many($skeys, array_fill('\\x00000000000000000000000000000001'::bytea, ARRAY[16]), 60000, 3600000) a \\gset
SELECT count(*) FROM idem_bucket_exp.split_complete_many($skeys, :fences::int8[], array_fill(convert_to('{"status":"ok"}', 'UTF8'), ARRAY[16]), 3600000) c WHERE c.ok;
SQL

"$tmp/idem" migrate --store "$pg_url&idem_schema=idem_bench" >/dev/null
# Today's table as bench-stores.sh fills it: in use and analyzed.
psql "$pg_url" -qc "TRUNCATE idem_bench.idem_records;
	INSERT INTO idem_bench.idem_records (k, state, fence, fp, attempts, result, lease_until, expires_at, updated_at, outcome)
	SELECT '\\x00'::bytea || convert_to('fill-' || i, 'UTF8'), 2, i, '', 1, '\\x00', now(), now() + interval '1 hour', now(), 1
	FROM generate_series(1, 100000) i; ANALYZE idem_bench.idem_records"
tps() { pgbench "$pg_url" -n -M prepared -c "$1" -j "$ncpu" -T "$secs" -f "$2" 2>&1 | awk '/^tps = / {print $3; exit}'; }
today=$(tps "$conc" "$tmp/today.sql")
bucket=$(tps "$conc" "$tmp/bucket.sql")
today16=$(tps 8 "$tmp/today16.sql")
bucket16=$(tps 8 "$tmp/bucket16.sql")
split=$(tps "$conc" "$tmp/split.sql")
split16=$(tps 8 "$tmp/split16.sql")

python3 - "$bytes24" "$bytes8" "$today" "$bucket" "$today16" "$bucket16" "$conc" "$floor_btree" "$floor_hash" "$floor_bucket" "$split_bytes" "$split" "$split16" <<'PY'
import sys
b24, b8, today, bucket, today16, bucket16 = map(float, sys.argv[1:7])
conc = sys.argv[7]
fl_btree, fl_hash, fl_bucket, split_bytes, split, split16 = map(float, sys.argv[8:14])
print(f"PostgreSQL a row per record at best (inserted once, a 16-byte key and a 60-byte value): {fl_btree:.1f} bytes with a unique B-tree,"
      f" {fl_hash:.1f} with a hash exclusion constraint, {fl_bucket:.1f} with a B-tree on a bucket of the key (no unique index)")
print(f"PostgreSQL buckets: bytes per completed record at 1,000,000 (target ≤ 120): {b24:.1f} with 24 a bucket, {b8:.1f} with 8")
print(f"PostgreSQL one key a transaction, {conc} clients: today's statements {today:.0f} lifecycles/s, buckets (8) {bucket:.0f}/s ({bucket / today:.2f}x, target ≥ 0.90)")
print(f"PostgreSQL a row per record, settled records never updated (split; 32 a bucket): {split_bytes:.1f} bytes per completed record at 1,000,000;"
      f" one key a transaction, {conc} clients: {split:.0f} lifecycles/s ({split / today:.2f}x of today's statements, target ≥ 0.90)")
print(f"PostgreSQL 16 keys a transaction, 8 clients: today's batch statements {16 * today16:.0f} lifecycles/s, buckets (8) {16 * bucket16:.0f}/s ({bucket16 / today16:.2f}x),"
      f" split {16 * split16:.0f}/s ({split16 / today16:.2f}x; target ≥ 0.90)")
PY
