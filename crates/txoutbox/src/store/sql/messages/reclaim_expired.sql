-- Takes back rows whose lease expired (their relay died, paused or lost the network): pending
-- again with the same key, or `unknown` for at-most-once destinations, where the attempt may
-- have reached the downstream and must not be repeated blindly. At most $1 rows per call.
--
-- Parameters:
-- $1 limit: int8
WITH expired AS (
    SELECT id, destination, lease_owner, lease_token, attempts, downstream_key,
        attempt_started_at, at_most_once FROM txoutbox_messages
    WHERE status = 'in_flight' AND lease_expires_at < now()
    ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED),
moved AS (
    UPDATE txoutbox_messages m SET
        status = CASE WHEN e.at_most_once THEN 'unknown' ELSE 'pending' END,
        next_attempt_at = now(),
        last_error = 'the lease of relay ' || e.lease_owner || ' expired during attempt '
            || e.attempts || CASE WHEN e.at_most_once
                THEN ' (at-most-once destination: not retried; replay it if it did not happen)'
                ELSE '' END,
        lease_owner = NULL, lease_expires_at = NULL, lease_token = NULL
    FROM expired e WHERE m.id = e.id
    RETURNING m.id, m.last_error, m.status),
logged AS (
    INSERT INTO txoutbox_attempt_log (message_id, destination, attempt, downstream_key, relay,
        lease_token, outcome, error, started_at)
    SELECT e.id, e.destination, e.attempts, e.downstream_key, e.lease_owner, e.lease_token,
        CASE WHEN mv.status = 'unknown' THEN 'unknown' ELSE 'expired' END, mv.last_error,
        COALESCE(e.attempt_started_at, now())
    FROM expired e JOIN moved mv ON mv.id = e.id)
SELECT count(*) FROM moved
