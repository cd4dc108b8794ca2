// Package model holds Promela models of idem's protocols, checked
// exhaustively at small bounds by SPIN (go test ./internal/model runs spin,
// gcc and the verifier); see README.md.
package model
