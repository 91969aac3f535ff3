-- An operator's pause of destination $1 by $2 for reason $3 (its row made if missing).
--
-- Parameters:
-- $1 destination: text
-- $2 by: text
-- $3 reason: text
INSERT INTO txoutbox_destinations AS d (destination, paused_at,
    paused_by, paused_reason) VALUES ($1, now(), $2, $3)
ON CONFLICT (destination) DO UPDATE SET paused_at = COALESCE(d.paused_at, now()),
    paused_by = $2, paused_reason = $3, updated_at = now()
