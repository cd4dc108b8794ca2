package dynamostore

// Wrap is wrap, for the tests of how errors are told apart.
var Wrap = wrap
