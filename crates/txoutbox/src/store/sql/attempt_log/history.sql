-- A message's attempt log (relay attempts and operator actions), in the order they happened.
--
-- Parameters:
-- $1 id: uuid
SELECT attempt, downstream_key, relay, lease_token, outcome, error,
    receipt, started_at, finished_at
FROM txoutbox_attempts WHERE message_id = $1
ORDER BY started_at, finished_at, attempt
