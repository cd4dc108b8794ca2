/*
 * The outbox: relays claiming rows under leases, sending them, and marking
 * them sent or failed, while leases end, relays crash, receipts arrive
 * before or after the relay marks a row sent, and an operator acks,
 * retries and skips rows. See README.md.
 *
 * Bounds (set with -D): P relays, C claims in all (the claim statements a
 * run sends), OPS operator or receipt acts in all. Rows 0 and 1 share
 * ordering key 0, row 2 has ordering key 1. PAST_DEAD: the relays'
 * DeadRowsReleaseOrderingKeys (a dead row does not hold back the later rows
 * of its key). Mutations (-D, one at a time) each break one rule the code
 * keeps; each must yield a counterexample:
 *   MUT_CLAIM_IGNORES_ORDER     a claim that ignores the ordering key
 *   MUT_CLAIM_BESIDE_A_CLAIM    a claimed row kept while another row of its
 *                               key is claimed (and maybe being sent)
 *   MUT_DEAD_RELEASES_KEY       a dead row not holding back its key's
 *                               later rows (without PAST_DEAD)
 *   MUT_MARK_SENT_ANY_STATUS    a relay's "sent" over a row acked meanwhile
 *   MUT_MARK_SENT_ANY_CLAIM     a relay's "sent" under a claim it lost
 *   MUT_KEY_PER_ATTEMPT         a new key for every attempt
 */

#ifndef P
#define P 2
#endif
#ifndef C
#define C 4
#endif
#ifndef OPS
#define OPS 2
#endif
#define R 3 /* rows */

/* outbox.Status */
#define PENDING 1
#define SENT    2
#define ACKED   3
#define DEAD    4
#define SKIPPED 5

/* The rows of idem_outbox, as the claim and the relay's writes read them:
 *   st   status
 *   cb   claimed_by: the claim's token, 0 for none
 *   cl   claimed_until > now: the claim's lease has not ended
 *   ok   ordering_key (rows are in id order: 0, 1, 2)
 *   key  the idempotency key (the key column: written once, at enqueue)
 */
byte st[R];
byte cb[R];
bool cl[R];
byte ok[R];
byte key[R];

byte claims; /* claim statements sent so far: their tokens are 1..C */
byte ops;    /* operator and receipt acts so far */

/* Ghost state, for the properties. */
byte sending[R];   /* sends of the row under way (a relay between its send's start and end) */
byte sentKey[R];   /* the key the row's first send carried, 0 before */
bool wasAcked[R];
bool wasSkipped[R];

/* finished: a row that no longer holds back the later rows of its key. */
#ifdef PAST_DEAD
#define finished(r) (st[r] == SENT || st[r] == ACKED || st[r] == SKIPPED || st[r] == DEAD)
#else
#define finished(r) (st[r] == SENT || st[r] == ACKED || st[r] == SKIPPED)
#endif

/* unfinished: the claim's "e.status IN ('pending', 'dead')" ('pending' alone
 * with DeadRowsReleaseOrderingKeys). */
#if defined(PAST_DEAD) || defined(MUT_DEAD_RELEASES_KEY)
#define unfinished(r) (st[r] == PENDING)
#else
#define unfinished(r) (st[r] == PENDING || st[r] == DEAD)
#endif

/* first(r): r is the first unfinished row of its ordering key — the claim's
 * "o.id <= (SELECT min(e.id) … WHERE e.ordering_key = o.ordering_key AND
 * e.status IN (…))". */
#define first(r) (!(r > 0 && ok[0] == ok[r] && unfinished(0)) && !(r > 1 && ok[1] == ok[r] && unfinished(1)))

/* conflict(r, tok): another row of r's ordering key, pending or dead, is
 * claimed under another token with a live lease — Store.keyConflicts's
 * query. (A claimed row is pending; it stops being so while claimed only
 * by an Ack, and then its receiver has it.) */
#define claimedOther(r, e, tok) (r != e && ok[e] == ok[r] && (st[e] == PENDING || st[e] == DEAD) && cb[e] != 0 && cb[e] != tok && cl[e])
#define conflict(r, tok) (claimedOther(r, 0, tok) || claimedOther(r, 1, tok) || claimedOther(r, 2, tok))

/* claimable: what the claim statement (Store.claim: claim, claimPastDead;
 * MySQL's claimMySQL) takes: a pending row, not under a live claim, first of
 * its ordering key. */
#ifdef MUT_CLAIM_IGNORES_ORDER
#define claimable(r) (st[r] == PENDING && !(cb[r] != 0 && cl[r]))
#else
#define claimable(r) (st[r] == PENDING && !(cb[r] != 0 && cl[r]) && first(r))
#endif

/* Statuses never go back: acked and skipped are final. Checked after every
 * write. */
inline monitor(r) {
	assert(!wasAcked[r] || st[r] == ACKED);
	assert(!wasSkipped[r] || st[r] == SKIPPED);
	if
	:: st[r] == ACKED -> wasAcked[r] = true
	:: st[r] == SKIPPED -> wasSkipped[r] = true
	:: else
	fi
}

/* claim: one statement, as Store.claim sends it; every row it takes is
 * claimable in the table as it was (one snapshot). Which of them it takes
 * (LIMIT) is any subset. */
inline claim(tok, take0, take1, take2) {
	atomic {
		claims++;
		tok = claims;
		take0 = claimable(0); take1 = claimable(1); take2 = claimable(2);
		/* never a row claimed before the earlier rows of its key are
		 * finished */
		assert(!take1 || !(ok[0] == ok[1] && !finished(0)));
		assert(!take2 || (!(ok[0] == ok[2] && !finished(0)) && !(ok[1] == ok[2] && !finished(1))));
		if
		:: take0 -> cb[0] = tok; cl[0] = true
		:: skip
		fi;
		if
		:: take1 -> cb[1] = tok; cl[1] = true
		:: skip
		fi;
		if
		:: take2 -> cb[2] = tok; cl[2] = true
		:: skip
		fi;
		take0 = false; take1 = false; take2 = false
	}
}

/* keyConflicts: after the claim, one query finds the claimed rows whose
 * ordering key has another row claimed under a live lease, and gives them
 * back (an UPDATE conditioned on the token). */
inline giveBackConflicts(tok, take0, take1, take2) {
	atomic {
#ifndef MUT_CLAIM_BESIDE_A_CLAIM
		take0 = cb[0] == tok && conflict(0, tok);
		take1 = cb[1] == tok && conflict(1, tok);
		take2 = cb[2] == tok && conflict(2, tok);
		if
		:: take0 -> cb[0] = 0; cl[0] = false
		:: else
		fi;
		if
		:: take1 -> cb[1] = 0; cl[1] = false
		:: else
		fi;
		if
		:: take2 -> cb[2] = 0; cl[2] = false
		:: else
		fi;
		take0 = false; take1 = false; take2 = false
#else
		skip
#endif
	}
}

/* The relay's send of row r under its claim tok (Relay.sendBatch): started
 * only while the claim lasts by the relay's clock — the send's context ends
 * before the claim's lease does (renewed while the send runs), so no lease
 * ends under a send (see the clock). */
inline sendStart(r, tok, k) {
	atomic {
		cb[r] == tok && cl[r] ->
		/* never two unacknowledged rows of one key in flight, nor one row
		 * twice: beside a send of another row of the key, one of the two
		 * is acked (its receipt came: its receiver has it, and the send is
		 * a repeat) */
		assert(sending[r] == 0);
		assert(st[r] == ACKED || !(r != 0 && ok[0] == ok[r] && sending[0] > 0 && st[0] != ACKED));
		assert(st[r] == ACKED || !(r != 1 && ok[1] == ok[r] && sending[1] > 0 && st[1] != ACKED));
		assert(st[r] == ACKED || !(r != 2 && ok[2] == ok[r] && sending[2] > 0 && st[2] != ACKED));
		/* a row is never sent under two keys */
#ifdef MUT_KEY_PER_ATTEMPT
		k = key[r] + claims;
#else
		k = key[r];
#endif
		assert(sentKey[r] == 0 || sentKey[r] == k);
		sentKey[r] = k;
		k = 0;
		sending[r]++
	}
}

inline sendEnd(r) {
	atomic { sending[r]-- }
}

/* markSent: "UPDATE … SET status = 'sent', claimed_by = NULL … WHERE
 * claimed_by = $token AND status = 'pending'". */
inline markSent(r, tok) {
	atomic {
		if
#ifdef MUT_MARK_SENT_ANY_STATUS
		:: cb[r] == tok -> st[r] = SENT; cb[r] = 0; cl[r] = false
#elif defined(MUT_MARK_SENT_ANY_CLAIM)
		:: st[r] == PENDING -> st[r] = SENT; cb[r] = 0; cl[r] = false
#else
		:: cb[r] == tok && st[r] == PENDING -> st[r] = SENT; cb[r] = 0; cl[r] = false
#endif
		:: else -> skip
		fi;
		monitor(r)
	}
}

/* markFailed: back to pending after its backoff, or dead (its last try),
 * under the same condition. */
inline markFailed(r, tok) {
	atomic {
		if
		:: cb[r] == tok && st[r] == PENDING -> st[r] = PENDING; cb[r] = 0; cl[r] = false
		:: cb[r] == tok && st[r] == PENDING -> st[r] = DEAD; cb[r] = 0; cl[r] = false
		:: else -> skip
		fi;
		monitor(r)
	}
}

/* A relay claims a batch, then sends its rows one by one (a relay sends a
 * batch's rows at once, but they are of different keys: the interleavings
 * of several relays cover those of one), each marked sent or failed; it may
 * crash at any step, leaving its claims to their leases. */
proctype relay(byte p) {
	byte tok, r, k;
	bool take0, take1, take2;
	do
	:: claims < C ->
		claim(tok, take0, take1, take2);
		if
		:: giveBackConflicts(tok, take0, take1, take2)
		:: goto crashed /* between the claim and its check */
		fi;
		r = 0;
		do
		:: r < R && cb[r] == tok ->
			if
			:: sendStart(r, tok, k);
				sendEnd(r);
				if
				:: skip; markSent(r, tok)
				:: skip; markFailed(r, tok)
				:: goto crashed /* between the send and its mark */
				fi
			:: !(cb[r] == tok && cl[r]) -> skip /* the claim ended before the send: not sent */
			:: goto crashed
			fi;
			r++
		:: r < R && cb[r] != tok -> r++
		:: r == R -> r = 0; break
		od
	:: claims >= C -> break
	od;
crashed:
	skip
}

/* The clock ends the lease of a claim that no send is under (see
 * sendStart); a crashed relay's claims end this way. */
proctype clock() {
	byte r;
	do
	:: atomic {
			r = 0;
			do
			:: r < R - 1 -> r++
			:: break
			od;
			if
			:: cl[r] && sending[r] == 0 -> cl[r] = false
			:: else -> skip
			fi;
			r = 0
		}
	od
}

/* Receipts and the operator, OPS acts in all: Ack (a receipt or business
 * acknowledgement: pending, sent or acked → acked), AckSent (an asynchronous
 * receipt of what was delivered: sent or acked → acked — one that comes
 * before the relay marked the row sent changes nothing), Refuse (a receipt
 * that refuses a sent row: retried now, or dead), Retry (dead → pending)
 * and Skip (dead → skipped). */
proctype operator() {
	byte r;
	do
	:: ops < OPS ->
		r = 0;
		do
		:: r < R - 1 -> r++
		:: break
		od;
		atomic {
			ops++;
			if
			:: st[r] == PENDING || st[r] == SENT || st[r] == ACKED -> st[r] = ACKED /* Ack */
			:: st[r] == SENT || st[r] == ACKED -> st[r] = ACKED /* AckSent */
			:: st[r] == SENT -> st[r] = PENDING /* Refuse, retried */
			:: st[r] == SENT -> st[r] = DEAD /* Refuse, dead */
			:: st[r] == DEAD -> st[r] = PENDING /* Retry */
			:: st[r] == DEAD -> st[r] = SKIPPED /* Skip */
			:: else -> skip
			fi;
			monitor(r);
			r = 0
		}
	:: ops >= OPS -> break
	od
}

init {
	byte i;
	atomic {
		i = 0;
		do
		:: i < R -> st[i] = PENDING; cb[i] = 0; cl[i] = false; key[i] = 10 * (i + 1); i++
		:: else -> break
		od;
		ok[0] = 0; ok[1] = 0; ok[2] = 1;
		i = 0;
		do
		:: i < P -> run relay(i); i++
		:: else -> break
		od;
		run clock();
		run operator()
	}
}
