-- The end of every `complete_*.sql` (by `parts/messages_end.sql` in those with outbox rows), after
-- the outbox rows written: the checks that make the statement fail, so that its writes are undone
-- and a COMMIT sent behind it rolls back instead (`txoutbox_refuse`): the key stored in another
-- transaction than its claim's (the claim's backend $9 and time $10; TXK01), a key stored first by
-- a concurrent request (no row `stored`; TXK02), and, when $11 asks, a savepoint open (the key
-- row's `xmin` is then a subtransaction's, not the top-level transaction's; TXK03). `stored` is
-- read once.
    CASE WHEN pg_backend_pid() <> $9 OR now() <> $10
        THEN txoutbox_refuse('TXK01', 'the claimed key is not in this transaction')
    WHEN s.outermost IS NULL
        THEN txoutbox_refuse('TXK02', 'a concurrent request stored the key first')
    WHEN $11 AND NOT s.outermost
        THEN txoutbox_refuse('TXK03', 'Claim::commit was given a transaction with a savepoint open; complete it and commit the outermost transaction')
    ELSE 0 END
FROM (SELECT bool_and(outermost) AS outermost FROM stored) AS s
