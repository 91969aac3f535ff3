-- Serialises the transactions that enqueue under the same ordering keys, so that insertion
-- order (`seq`) is commit order within a key. Locks in a fixed order to avoid deadlocks.
--
-- Parameters:
-- $1 keys: text[]
SELECT count(pg_advisory_xact_lock(h)) FROM (
SELECT DISTINCT hashtextextended(k, 7160) AS h FROM unnest($1::text[]) AS k ORDER BY h) AS l
