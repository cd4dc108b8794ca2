// Package edi reads and writes the envelopes of EDIFACT and X12 interchanges
// for idempotent exchange:
//
//   - Reader streams interchanges from bytes or an io.Reader, for both
//     standards, with any UNA or ISA delimiters, the release character, UNG
//     and GS groups, CR/LF after terminators and several interchanges per
//     file; it validates the envelopes (control references, counts, formats)
//     and reports every problem with its byte offset, never panicking.
//   - Interchange.Key is the canonical inbound dedup key, so a partner's
//     retransmission is caught by an idem.Guard (and idem serve --key-from edi).
//   - Render writes an interchange for a partner profile, with control numbers
//     allocated once per business intent from persisted counters in the
//     caller's transaction; EnqueueTx stores the rendered bytes on the outbox
//     row so every retry resends the identical bytes.
//   - AS2MessageID and AS4MessageID derive transport ids from the intent key.
//
// The business key, e.g. ORD-20260514-0001, fits neither EDIFACT 0020 (an..14)
// nor X12 ISA13 (exactly 9 digits): it travels in UNH 0068 and the BGM/BEG
// document number, and the control numbers are allocated, stored and resent.
package edi
