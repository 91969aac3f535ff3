-- Logs a destination-wide operator action ($2: `paused`, `resumed`) on destination $1 with the
-- note $3: no message, attempt 0, relay `operator`.
--
-- Parameters:
-- $1 destination: text
-- $2 outcome: text
-- $3 note: text
INSERT INTO txoutbox_attempt_log (message_id, destination,
    attempt, downstream_key, relay, outcome, error, started_at, finished_at)
VALUES (NULL, $1, 0, '', 'operator', $2, $3, now(), now())
