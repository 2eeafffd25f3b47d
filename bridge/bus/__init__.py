"""The bus's records and the bus itself: records (refs, ids, request/claim/cancel files, entries,
snapshots), bus (a bus remote and its local object store), ledger (finished requests out of refs), trust
(allowed signers, signed commits), presence (live runners), livelog (a run's output while it runs),
progress (a served request's progress record)."""
