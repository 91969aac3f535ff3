-- Inbox records (`txoutbox_inbox`), expired ones awaiting the purge, and messages consumers
-- gave up (through the partial index `txoutbox_inbox_failed`), each reading at most $1 rows.
--
-- Parameters:
-- $1 bound: int8
SELECT
(SELECT count(*) FROM (SELECT 1 FROM txoutbox_inbox LIMIT $1) a),
(SELECT count(*) FROM (SELECT 1 FROM txoutbox_inbox WHERE expires_at <= now() LIMIT $1) e),
(SELECT count(*) FROM (SELECT 1 FROM txoutbox_inbox WHERE outcome = 'failed' LIMIT $1) f)
