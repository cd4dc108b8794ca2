// Command edi-orders shows the sender side of idempotent EDI end to end, in
// one process:
//
//  1. the application records each order and its EDIFACT ORDERS interchange
//     in one SQLite transaction: the key (ORD-<date>-<n>) and the control
//     numbers come from persisted counters, the rendered bytes go into the
//     outbox;
//  2. the relay sends each interchange AS2-style (no signing or encryption)
//     with the same Message-ID, Date and bytes on every attempt;
//  3. the partner sits behind the same middleware `idem serve --key-from edi`
//     runs, which keys each interchange by its sender, recipient and control
//     reference; in front of it, a lossy network drops the answer to the first
//     attempt of every interchange — after the partner booked it.
//
// It prints what happened and exits 1 unless every order was booked once.
//
//	go run ./examples/edi-orders [--orders N] [--db PATH]
package main
