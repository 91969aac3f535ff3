-- Takes over the expired record of message $2 of consumer $1 (the message is new again):
-- received now, for $3 seconds, outcome $4, error $5. No row when a concurrent delivery took it
-- over first (READ COMMITTED re-reads the row it waited for, and finds it live).
--
-- Parameters:
-- $1 consumer: text
-- $2 message_id: text
-- $3 window_secs: float8
-- $4 outcome: text
-- $5 error: text
UPDATE txoutbox_inbox SET received_at = now(),
    expires_at = now() + make_interval(secs => $3), outcome = $4, error = $5
WHERE consumer = $1 AND message_id = $2 AND expires_at <= now() RETURNING received_at
