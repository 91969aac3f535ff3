-- Puts hot rows $1 back to pending with downstream keys $2: due now, a fresh attempt budget, no
-- lease (a late completion of an old lease is fenced off by the cleared token), no last error.
--
-- Parameters:
-- $1 ids: uuid[]
-- $2 keys: text[]
UPDATE txoutbox_messages m SET status = 'pending',
    next_attempt_at = now(), attempts = 0, lease_owner = NULL, lease_expires_at = NULL,
    lease_token = NULL, attempt_started_at = NULL, at_most_once = false, last_error = NULL,
    downstream_key = i.downstream_key
FROM unnest($1::uuid[], $2::text[]) AS i(id, downstream_key)
WHERE m.id = i.id RETURNING m.id
