-- Counts the expired records (what a purge deletes).
--
-- Parameters: none.
SELECT count(*) FROM txoutbox_inbox WHERE expires_at <= now()
