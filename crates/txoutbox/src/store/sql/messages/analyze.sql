-- Gathers the hot table's statistics (a role that does not own the table gets a warning and
-- nothing changes).
--
-- Parameters: none.
ANALYZE txoutbox_messages
